// The input projection's epilogues on the TMA loop (gemm_tma.cuh), forward and backward: its
// a/b columns (4Ch of them, in wcat's order, dlin_order.h) in tiles of 128 columns, one consumer
// warpgroup per 64 pixels (ProjectTile, ProjectBackwardTile). The output-gate columns and the shapes
// TMA cannot take stay on the wgmma and mma.sync loops (epilogues.cuh).
#pragma once
#include "trimul/epilogues.cuh"
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
  static constexpr int kConsumers = ProjectTile::kConsumers, kProducerRegs = ProjectTile::kProducerRegs,
                       kConsumerRegs = ProjectTile::kConsumerRegs;
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
  __device__ Pre load(int, int64_t, int, int) const { return {}; }

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
// da p mask s (1 - s), in wgmma's accumulator layout. Thread (g, t) of warp w holds, at pixel
// rows 16w + g + 8h, the tile's columns 8i + 2t + e of n8 tiles i: channel 4i + t's projection
// (e = 0) and gate (e = 1), which dlin_order.h puts at dlin column 32 (i / 4) + 8t + 2 (i % 4) +
// e; a row's four tiles of one i / 4 are then one 16-byte store of high parts and one of low.
// load() reads the thread's 32 da/db values before the tile's MMAs (a warp instruction reads 8
// consecutive pixels of 4 channels: whole 32-byte sectors). Column sums in a fixed order: a
// reduce-scatter over a warp's 8 rows g (28 shuffles for its 32 columns), the 4 warps through
// shared memory, then the two warpgroups of each 128-row half (the partials' m-tile, which the
// output stage's gate columns share) as even + odd.
template <class T>
struct ProjectBackwardAbEpilogue {
  using Tile = ProjectBackwardTile;
  static constexpr int kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  static constexpr int kConsumers = Tile::kConsumers, kProducerRegs = Tile::kProducerRegs,
                       kConsumerRegs = Tile::kConsumerRegs;
  static_assert(kBlockN == 128 && GemmConfig::kBlockM == 128 && kConsumers % 2 == 0 && kConsumers + 1 + kConsumers / 2 <= 15,
                "64 channels a tile; warpgroup pairs per 128-row m-tile, a named barrier each");
  static constexpr int kBiasBytes = 4 * 256 * 4;         // the a/b columns' biases, 4Ch <= 1024
  static constexpr int kWarpSumBytes = 2 * 4 * 128 * 4;  // a warpgroup's [tile parity][warp][column]
  static constexpr int kPairBytes = 2 * 128 * 4;         // a pair's [tile parity][column]: the odd one's sums
  static constexpr int kSmemBytes = kBiasBytes + kConsumers * kWarpSumBytes + kConsumers / 2 * kPairBytes;
  Dims d;
  const float* bias;         // [4Ch + C] in wcat's order
  MaskRef mask;
  const float *da, *db;      // channel-major
  T* dlin;                   // [rows][P + 4Ch]: high parts, then the a/b columns' low parts at P + column
  float* colsum_lin;         // [m-tiles of 128 pixels][4Ch + C]
  int64_t dlin_row0, m_end;  // the pixel of dlin's first row; the end of the pixels (a chunk's)

  struct Pre {
    float up[2][16];  // [h][n8 tile i] da or db of channel 4i + t at pixel row 16w + g + 8h
    float mk[2];      // [h] that row's mask
  };

  __device__ void start(uint8_t* smem, int) const {
    float* bs = reinterpret_cast<float*>(smem);
    for (int i = threadIdx.x; i < 4 * d.Ch; i += 128 * kConsumers) bs[i] = bias[i];
  }
  __device__ void finish(int) const {}

  __device__ Pre load(int cw, int64_t m0, int n0, int) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int Ch = static_cast<int>(d.Ch);
    const int64_t plane = d.plane();
    Pre p;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + 64 * cw + 16 * w + g + 8 * h;
      const bool in = m < m_end;
      const int64_t base = in ? cm_offset(d, m, 0) : 0;
      p.mk[h] = in ? mask_at(mask, m, d.N) : 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int ch = n0 / 2 + 4 * i + tq;
        const float* src = ch < Ch ? da + ch * plane : db + (ch - Ch) * plane;
        p.up[h][i] = in ? src[base] : 0.f;
      }
    }
    return p;
  }

  __device__ void tile(uint8_t* smem, const float (&acc)[1][64], const Pre& pre, int cw, int64_t m0, int n0, int,
                       int k) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int64_t ldl = d.dlin_cols(), lds = d.proj_cols();
    const float* bs = reinterpret_cast<const float*>(smem) + n0;  // [128] the tile's biases
    float sum[32] = {};  // [8 (i / 4) + 2 (i % 4) + e] this thread's columns over its two rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + 64 * cw + 16 * w + g + 8 * h;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float v[8], lo[8];  // [2n + e] dlin columns 32q + 8t + 2n + e; their low parts
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int i = 4 * q + n, c = 8 * i + 2 * tq;
          const float up = pre.up[h][i] * pre.mk[h];
          const float p = acc[0][4 * i + 2 * h] + bs[c], s = sigmoid(acc[0][4 * i + 2 * h + 1] + bs[c + 1]);
          v[2 * n] = up * s;
          v[2 * n + 1] = up * p * s * (1.f - s);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[8 * q + e] += v[e], lo[e] = v[e] - dev::to_float(dev::from_float<T>(v[e]));
        if (m < m_end) {
          T* row = dlin + (m - dlin_row0) * ldl + n0 + 32 * q + 8 * tq;
          *reinterpret_cast<uint4*>(row) = dev::pack8<T>(v);
          *reinterpret_cast<uint4*>(row + lds) = dev::pack8<T>(lo);
        }
      }
    }
    column_sums(smem, sum, cw, k, m0 + 128 * (cw / 2), n0, lds);
  }

  // One level of the reduce-scatter over lanes kBit apart (a bit of g): each keeps kBit of its
  // 2 kBit values, the upper ones where its bit is set, plus its partner's of the same.
  template <int kBit>
  __device__ static void reduce_scatter(float (&sum)[32], int lane) {
    const bool upper = lane & kBit;
#pragma unroll
    for (int j = 0; j < kBit; ++j) {
      const float send = upper ? sum[j] : sum[j + kBit], keep = upper ? sum[j + kBit] : sum[j];
      sum[j] = keep + __shfl_xor_sync(0xffffffffu, send, kBit);
    }
  }

  // Lane (g, t)'s sums end as sum[j], j < 4: dlin columns 32 (g / 2) + 8t + 4 (g % 2) + j (the
  // reduce-scatter keeps the upper half where the lane's bit is set: index 4g + j of sum).
  __device__ __forceinline__ void column_sums(uint8_t* smem, float (&sum)[32], int cw, int k, int64_t half_row, int n0,
                              int64_t lds) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int wt = threadIdx.x % 128;
    reduce_scatter<16>(sum, lane);
    reduce_scatter<8>(sum, lane);
    reduce_scatter<4>(sum, lane);
    float* warps = reinterpret_cast<float*>(smem + kBiasBytes + cw * kWarpSumBytes) + (k & 1) * 4 * 128;
    *reinterpret_cast<float4*>(warps + w * 128 + 32 * (g >> 1) + 8 * tq + 4 * (g & 1)) =
        make_float4(sum[0], sum[1], sum[2], sum[3]);
    dev::bar_sync(1 + cw, 128);
    const float tot = warps[wt] + warps[128 + wt] + warps[256 + wt] + warps[384 + wt];
    float* pair = reinterpret_cast<float*>(smem + kBiasBytes + kConsumers * kWarpSumBytes + (cw / 2) * kPairBytes) +
                  (k & 1) * 128;
    if (cw & 1) pair[wt] = tot;
    dev::bar_sync(kConsumers + 2 + cw / 2, 256);
    if (!(cw & 1) && half_row < m_end) colsum_lin[(half_row / 128) * lds + n0 + wt] = tot + pair[wt];
  }
};

}  // namespace tpf::trimul
