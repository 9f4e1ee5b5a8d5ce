// The input projection's epilogues on the TMA loop (gemm_tma.cuh), forward and backward: its
// a/b columns (4Ch of them, in wcat's order, dlin_order.h) in tiles of 128 columns, one consumer
// warpgroup per 64 pixels (ProjectTile, ProjectBackwardTile). The output-gate columns and the shapes
// TMA cannot take stay on the wgmma and mma.sync loops (epilogues.cuh).
#pragma once
#include "common/tma.cuh"
#include "trimul/epilogues.cuh"
#include "trimul/gemm_tma.cuh"
#include "trimul/tile_config.h"

namespace tpf::trimul {

// The input projection's a/b tiles on the TMA loop (gemm_tma.cuh) where N % 8 == 0 (no row pads;
// 8 pixels from a multiple of 8 lie in one matrix row). Each consumer warpgroup forms
// a = sigmoid(g) p mask for its 64 pixel rows and the tile's 64 channels from its accumulators
// (both logits of channel 4i + t in one thread: acc[4i + 2h], the projection, and
// acc[4i + 2h + 1], the gate, at pixel row 16w + g + 8h; dlin_order.h); stmatrix transposes each
// 8 pixel x 8 channel block as 16-bit values into the warpgroup's buffer [64 channels][64
// pixels], whose 16-byte chunk k of channel i's 128-byte row sits at k ^ (i % 8) (the eight rows
// one stmatrix writes fall in distinct banks); then its lanes store 8 pixels of a channel (16
// bytes) at a time.
template <class T>
struct ProjectAbEpilogue {
  static constexpr int kBlockN = ProjectTile::kBlockN, kStages = ProjectTile::kStages;
  static constexpr int kConsumers = ProjectTile::kConsumers, kColGroups = 1,
                       kProducerRegs = ProjectTile::kProducerRegs, kConsumerRegs = ProjectTile::kConsumerRegs;
  static constexpr int kTileBytes = 64 * 64 * 2;            // [64 channels][64 pixels], 16-bit
  static constexpr int kBufBytes = 2 * kTileBytes + 8 * 8;  // T's tile, the bf16 copy's, 8 chunk offsets
  static constexpr int kBiasBytes = 4 * 256 * 4;            // the a/b columns' biases, 4Ch <= 1024
  static constexpr int kSmemBytes = kBiasBytes + kConsumers * kBufBytes;
  Dims d;
  const float* bias;  // [4Ch + C], LayerNorm beta folded in
  MaskRef mask;
  T *a, *b;                    // channel-major
  __nv_bfloat16 *a_bf, *b_bf;  // channel-major copies, optional

  __device__ static int cm_chunk(int i, int k) { return i * 128 + ((k ^ (i & 7)) << 4); }  // bytes

  __device__ void start(uint8_t* smem, int) const {
    float* bs = reinterpret_cast<float*>(smem);
    for (int i = threadIdx.x; i < 4 * d.Ch; i += 128 * kConsumers) bs[i] = bias[i];
  }
  __device__ void finish(int) const {}
  struct Pre {};
  __device__ Pre load(uint8_t*, int, int64_t, int, int, int) const { return {}; }

  __device__ void tile(uint8_t* smem, const float (&acc)[1][64], const Pre&, int cw, int64_t m0, int n0, int,
                       int) const {
    const int64_t M = d.M(), r0 = m0 + 64 * cw;  // the warpgroup's first pixel
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int wt = threadIdx.x % 128;
    const float* bs = reinterpret_cast<const float*>(smem) + n0;  // [128] the tile's biases
    uint8_t* buf = smem + kBiasBytes + cw * kBufBytes;
    int64_t* rows = reinterpret_cast<int64_t*>(buf + 2 * kTileBytes);  // [8] chunk q's channel-0 offset, -1 past M
    float mr[2];  // [h] the masks of this thread's pixel rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = r0 + 16 * w + g + 8 * h;
      mr[h] = m < M ? mask_at(mask, m, d.N) : 0.f;
    }
    dev::bar_sync(1 + cw, 128);  // the previous tile's stores have read the buffer
    if (wt < 8) rows[wt] = r0 + 8 * wt < M ? cm_offset(d, r0 + 8 * wt, 0) : -1;
    const uint32_t s16 = dev::smem_addr(buf);
    // This lane's stmatrix row: matrix mx = 2 h + k holds channels 16q + 8k + {t, 4 + t} at pixel
    // rows 16w + 8h; its transpose's row j is channel 16q + 8k + 4 (j % 2) + j / 2.
    const int mx = lane >> 3, j = lane & 7;
    const int st_ch = 8 * (mx & 1) + 4 * (j & 1) + (j >> 1), chunk = 2 * w + (mx >> 1);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t v16[4], vbf[4];  // [2h + k] two channels' a at one pixel, packed
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          float v[2];  // [e] channel 16q + 8kk + 4e + t
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 4 * q + 2 * kk + e, c = 8 * i + 2 * tq;  // n8 tile, the channel's first column
            v[e] = sigmoid(acc[0][4 * i + 2 * h + 1] + bs[c + 1]) * (acc[0][4 * i + 2 * h] + bs[c]) * mr[h];
          }
          v16[2 * h + kk] = dev::MmaOp<T>::pack(v[0], v[1]);
          vbf[2 * h + kk] = dev::MmaOp<__nv_bfloat16>::pack(v[0], v[1]);
        }
      dev::stmatrix_x4_trans(s16 + cm_chunk(16 * q + st_ch, chunk), v16);
      if (a_bf) dev::stmatrix_x4_trans(s16 + kTileBytes + cm_chunk(16 * q + st_ch, chunk), vbf);
    }
    dev::bar_sync(1 + cw, 128);
    const int64_t plane = d.plane();
    const int Ch = static_cast<int>(d.Ch);
#pragma unroll
    for (int q = wt; q < 64 * 8; q += 128) {  // 16-byte chunks: channel q / 8, pixels 8 (q % 8) ..
      const int i = q / 8, kk = q % 8, ch = n0 / 2 + i;
      const int64_t row = rows[kk];
      if (row < 0) continue;
      const int64_t off = (ch < Ch ? ch : ch - Ch) * plane + row;
      *reinterpret_cast<uint4*>((ch < Ch ? a : b) + off) = *reinterpret_cast<const uint4*>(buf + cm_chunk(i, kk));
      if (a_bf)
        *reinterpret_cast<uint4*>((ch < Ch ? a_bf : b_bf) + off) =
            *reinterpret_cast<const uint4*>(buf + kTileBytes + cm_chunk(i, kk));
    }
  }
};


// The backward's a/b tiles: ProjectBackwardEpilogue's d p = da sigmoid(g) mask and d g =
// da p mask s (1 - s) from the accumulators. Four consumer warpgroups split the 128 x 128 tile
// into two row halves (rh = cw / 2) by two column halves (hc = cw % 2: 32 channels, m64n64):
// thread (g, t) of warp w holds, at pixel row 64 rh + 16w + g + 8h, the tile's columns 64 hc +
// 8i + 2t + e (i < 8): channel 32 hc + 4i + t's projection (e = 0) and gate (e = 1), which
// dlin_order.h puts at dlin column 64 hc + 32 (i / 4) + 8t + 2 (i % 4) + e, so a row's four tiles
// of one i / 4 are one 16-byte store of high parts and one of low.
// da/db arrive by TMA a tile ahead: load() has the warpgroup's leader copy its 64 pixels x 32
// channels (two boxes of [32 channels][32 pixels] fp32 in the 128-byte swizzle) into the slot
// of that tile's parity, and tile() waits for them. (Loaded into registers instead, they left
// room for two consumer warpgroups only, which could not hide the epilogue's latency.) Column
// sums in a fixed order: a reduce-scatter over a warp's 8 rows g, the 4 warps through shared
// memory, then the row halves as rh 0 + rh 1 (the partials' m-tile is the 128-row tile, which
// the output stage's gate columns share).
template <class T>
struct ProjectBackwardAbEpilogue {
  using Tile = ProjectBackwardTile;
  static constexpr int kBlockN = Tile::kBlockN, kStages = Tile::kStages, kConsumers = Tile::kConsumers,
                       kColGroups = 2, kProducerRegs = Tile::kProducerRegs, kConsumerRegs = Tile::kConsumerRegs;
  static_assert(kBlockN == 128 && kConsumers == 4 && GemmConfig::kBlockM == 128,
                "two row halves x two column halves of the column sums' 128-row m-tile");
  static constexpr int kBoxBytes = 32 * 128;                         // [32 channels][32 pixels] fp32
  static constexpr int kSlotBytes = 2 * kBoxBytes;                   // a warpgroup's 64 pixels
  static constexpr int kSlotsBytes = kConsumers * 2 * kSlotBytes;    // [warpgroup][tile parity]
  static constexpr int kBiasBytes = 4 * 256 * 4;                     // the a/b columns' biases, 4Ch <= 1024
  static constexpr int kWarpSumBytes = 2 * 4 * 64 * 4;               // a warpgroup's [parity][warp][column]
  static constexpr int kPairBytes = 2 * 64 * 4;                      // a column half's [parity][column]: rh 1's
  static constexpr int kSmemBytes =
      kSlotsBytes + kBiasBytes + kConsumers * kWarpSumBytes + 2 * kPairBytes + kConsumers * 2 * 8;
  CUtensorMap da_map, db_map;  // (pixels of a plane, channels, batch) fp32, boxes of 32 x 32
  Dims d;
  const float* bias;         // [4Ch + C] in wcat's order
  MaskRef mask;
  T* dlin;                   // [rows][P + 4Ch]: high parts, then the a/b columns' low parts at P + column
  float* colsum_lin;         // [m-tiles of 128 pixels][4Ch + C]
  int64_t dlin_row0, m_end;  // the pixel of dlin's first row; the end of the pixels (a chunk's)

  struct Pre {
    float mk[2];  // [h] the mask at pixel row 64 rh + 16w + g + 8h (0 past m_end)
  };

  __device__ static float* bias_smem(uint8_t* smem) { return reinterpret_cast<float*>(smem + kSlotsBytes); }
  __device__ static uint32_t slot(uint8_t* smem, int cw, int parity) {
    return dev::smem_addr(smem) + (2 * cw + parity) * kSlotBytes;
  }
  __device__ static uint32_t bar(uint8_t* smem, int cw, int parity) {
    return dev::smem_addr(smem) + kSmemBytes - kConsumers * 2 * 8 + (2 * cw + parity) * 8;
  }

  __device__ void start(uint8_t* smem, int cw) const {
    float* bs = bias_smem(smem);
    for (int i = threadIdx.x; i < 4 * d.Ch; i += 128 * kConsumers) bs[i] = bias[i];
    if (threadIdx.x % 128 == 0) {
      dev::mbar_init(bar(smem, cw, 0), 1);
      dev::mbar_init(bar(smem, cw, 1), 1);
      dev::mbar_init_fence();
    }
  }
  __device__ void finish(int) const {}

  __device__ Pre load(uint8_t* smem, int cw, int64_t m0, int n0, int, int k) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2;
    const int64_t r0 = m0 + 64 * (cw / 2);  // the warpgroup's first pixel
    Pre p;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = r0 + 16 * w + g + 8 * h;
      p.mk[h] = m < m_end ? mask_at(mask, m, d.N) : 0.f;
    }
    if (threadIdx.x % 128 == 0) {  // past the pixels the boxes read as zeros, and still complete
      const int64_t plane = d.N * d.N;  // N % 8 == 0: no row pads, and 64-pixel groups stay in a plane
      const int b = static_cast<int>(r0 / plane), px = static_cast<int>(r0 % plane);
      const int ch = n0 / 2 + 32 * (cw % 2), Ch = static_cast<int>(d.Ch);
      const CUtensorMap* map = ch < Ch ? &da_map : &db_map;
      const uint32_t dst = slot(smem, cw, k & 1), full = bar(smem, cw, k & 1);
      dev::fence_proxy_async();  // the slot's reads two tiles ago, before the copy's writes
      dev::mbar_arrive_expect_tx(full, kSlotBytes);
      dev::tma_load_3d(dst, map, full, px, ch < Ch ? ch : ch - Ch, b);
      dev::tma_load_3d(dst + kBoxBytes, map, full, px + 32, ch < Ch ? ch : ch - Ch, b);
    }
    return p;
  }

  // da/db of channel row c (< 32) at pixel x (< 32) of a box in the 128-byte swizzle.
  __device__ static float box_at(const uint8_t* box, int c, int x) {
    return *reinterpret_cast<const float*>(box + c * 128 + ((((x >> 2) ^ (c & 7)) << 4) | ((x & 3) << 2)));
  }

  __device__ void tile(uint8_t* smem, const float (&acc)[1][32], const Pre& pre, int cw, int64_t m0, int n0, int,
                       int k) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int rh = cw / 2, hc = cw % 2;
    const int64_t ldl = d.dlin_cols(), lds = d.proj_cols();
    const float* bs = bias_smem(smem) + n0 + 64 * hc;  // [64] the warpgroup's columns' biases
    const uint8_t* boxes = smem + (2 * cw + (k & 1)) * kSlotBytes;
    dev::mbar_wait(bar(smem, cw, k & 1), (k >> 1) & 1);
    float sum[16] = {};  // [8 (i / 4) + 2 (i % 4) + e] this thread's columns over its two rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * w + g + 8 * h;  // the pixel row in the warpgroup's 64
      const int64_t m = m0 + 64 * rh + r;
      const uint8_t* box = boxes + (r / 32) * kBoxBytes;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        float v[8], lo[8];  // [2n + e] dlin columns 64 hc + 32q + 8t + 2n + e; their low parts
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int i = 4 * q + n, c = 8 * i + 2 * tq;
          const float up = box_at(box, 4 * i + tq, r % 32) * pre.mk[h];
          const float p = acc[0][4 * i + 2 * h] + bs[c], s = sigmoid(acc[0][4 * i + 2 * h + 1] + bs[c + 1]);
          v[2 * n] = up * s;
          v[2 * n + 1] = up * p * s * (1.f - s);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[8 * q + e] += v[e], lo[e] = v[e] - dev::to_float(dev::from_float<T>(v[e]));
        if (m < m_end) {
          T* row = dlin + (m - dlin_row0) * ldl + n0 + 64 * hc + 32 * q + 8 * tq;
          *reinterpret_cast<uint4*>(row) = dev::pack8<T>(v);
          *reinterpret_cast<uint4*>(row + lds) = dev::pack8<T>(lo);
        }
      }
    }
    column_sums(smem, sum, cw, k, m0, n0, lds);
  }

  // One level of the reduce-scatter over lanes `bit` apart (a bit of g): each keeps kHalf of
  // its 2 kHalf values, the upper ones where its bit is set, plus its partner's of the same.
  template <int kHalf, int kN>
  __device__ static void reduce_scatter(float (&sum)[kN], int lane, int bit) {
    const bool upper = lane & bit;
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      const float send = upper ? sum[j] : sum[j + kHalf], keep = upper ? sum[j + kHalf] : sum[j];
      sum[j] = keep + __shfl_xor_sync(0xffffffffu, send, bit);
    }
  }

  // After the three levels lane (g, t) holds sum[j], j < 2, at index 2g + j: the warpgroup's
  // column 32 (g / 4) + 8t + 2 (g % 4) + j.
  __device__ __forceinline__ void column_sums(uint8_t* smem, float (&sum)[16], int cw, int k, int64_t m0, int n0,
                                              int64_t lds) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int wt = threadIdx.x % 128, rh = cw / 2, hc = cw % 2;
    reduce_scatter<8>(sum, lane, 16);
    reduce_scatter<4>(sum, lane, 8);
    reduce_scatter<2>(sum, lane, 4);
    uint8_t* sums = smem + kSlotsBytes + kBiasBytes;
    float* warps = reinterpret_cast<float*>(sums + cw * kWarpSumBytes) + (k & 1) * 4 * 64;  // [warp][column]
    *reinterpret_cast<float2*>(warps + w * 64 + 32 * (g >> 2) + 8 * tq + 2 * (g & 3)) = make_float2(sum[0], sum[1]);
    dev::bar_sync(1 + cw, 128);
    float* pair = reinterpret_cast<float*>(sums + kConsumers * kWarpSumBytes + hc * kPairBytes) + (k & 1) * 64;
    const float tot = wt < 64 ? warps[wt] + warps[64 + wt] + warps[128 + wt] + warps[192 + wt] : 0.f;
    if (rh == 1 && wt < 64) pair[wt] = tot;
    dev::bar_sync(kConsumers + 2 + hc, 256);
    if (rh == 0 && wt < 64 && m0 < m_end) colsum_lin[(m0 / 128) * lds + n0 + 64 * hc + wt] = tot + pair[wt];
  }
};

// The fp32 channel-major planes of da or db ([B][Ch][N][N], N % 8 == 0) as the epilogue's map.
inline bool encode_channel_planes(CUtensorMap* map, const float* ptr, const Dims& d) {
  const int64_t plane = d.N * d.N;
  return d.N == d.Np && encode_tma_matrices(map, ptr, plane, d.Ch * plane, d.Ch, plane, CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                                            4, 32, static_cast<int>(d.B));
}

}  // namespace tpf::trimul
