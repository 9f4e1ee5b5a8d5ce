// GEMM epilogues of the multiplicative-update stages: what each product's fp32 tile becomes.
#pragma once
#include "common/warp_roles.cuh"
#include "residual/rows.cuh"
#include "trimul/gemm.cuh"
#include "trimul/layout.h"

namespace tpf::trimul {

// 1 / (1 + e^-x): relatively accurate in both tails (a saturated gate's s and s(1 - s) keep
// their digits). Not 0.5 tanh(x/2) + 0.5: tanh.approx's absolute error (~2^-11) would swamp s
// and s(1 - s) for |x| > ~6, i.e. exactly the saturated gates of a trained model.
// e^-x as 2^(-x log2 e) with ex2.approx.ftz (max relative error 2^-22; a result below 2^-126
// flushes to zero, where 1 + e^-x is 1 in fp32 anyway): __expf adds a denormal-range fix-up of
// three instructions per call.
__device__ __forceinline__ float sigmoid(float x) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  return __fdividef(1.f, 1.f + e);
}

// Loads the tile's 128 bias values into the scratch area (bias[n0 + n], zero past `count`).
// Synchronises; the scratch is then read-only until the epilogue's first vector_column_sums.
__device__ __forceinline__ const float* stage_bias(const EpiTile& t, const float* bias, int n0,
                                                   int count) {
  if (threadIdx.x < Cfg::kBlockN)
    t.scratch[threadIdx.x] = n0 + static_cast<int>(threadIdx.x) < count ? bias[n0 + threadIdx.x] : 0.f;
  __syncthreads();
  return t.scratch;
}

template <class T>
__device__ __forceinline__ T to16(float v) { return dev::from_float<T>(v); }

// Input projection. Columns of the concatenated weight come in groups of 128 for 64 channels of
// [a | b] (2Ch channels), each channel's projection then its gate (dlin_order.h), so one tile
// holds both factors of a = sigmoid(g) * p * mask; after the 4Ch a/b columns come the C
// output-gate columns. a and b go channel-major (the triangle product's operands, T) and, where
// asked, as bf16 copies (a saving forward keeps them for the backward's bf16 products); the
// output gate pixel-major in fp16, as sigmoid(logit) (forward) and/or the logit itself (the
// backward's).
// An output-gate tile's packed fp16 pairs of n8 tiles 4q .. 4q + 3 from wgmma's accumulators
// (pk[n][h]: columns 8 (4q + n) + 2t, + 1 at row half h; bs: the tile's 128 biases): the logit, or
// sigmoid(logit) where `sig`.
__device__ __forceinline__ void pack_gate(const float (&acc)[64], const float* bs, int q, bool sig,
                                          uint32_t (&pk)[kFragNi][2]) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < kFragNi; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * q + n, col = 8 * i + 2 * tq;
      const float l0 = acc[4 * i + 2 * h] + bs[col], l1 = acc[4 * i + 2 * h + 1] + bs[col + 1];
      pk[n][h] = sig ? dev::MmaOp<__half>::pack(sigmoid(l0), sigmoid(l1)) : dev::MmaOp<__half>::pack(l0, l1);
    }
}

// What the input projection writes (either main loop's epilogue below).
template <class T>
struct ProjectOutputs {
  Dims d;
  const float* bias;  // [4Ch + C], LayerNorm beta folded in
  MaskRef mask;
  T *a, *b;                    // channel-major
  __nv_bfloat16 *a_bf, *b_bf;  // channel-major copies, optional
  __half *gate, *logit;        // [M][C], each optional
};
// The input projection on the wgmma loop, where N % 8 != 0 (elsewhere ProjectTmaEpilogue on the
// TMA loop): the output-gate tiles from its fragments, the a/b tiles staged.
template <class T>
struct ProjectEpilogue : ProjectOutputs<T> {
  using Out = ProjectOutputs<T>;
  using Out::d, Out::bias, Out::mask, Out::a, Out::b, Out::a_bf, Out::b_bf, Out::gate, Out::logit;
  // a/b tiles are staged channel-major: their stores run along pixels.
  __device__ bool channel_major_tile(int n0) const { return n0 < 4 * d.Ch; }

  // The output-gate tiles from registers; the a/b tiles take the staged path.
  __device__ bool wgmma_fragments(const EpiTile& t, const float (&acc)[64], int row0, int64_t m0, int n0,
                                  int) const {
    if (n0 < 4 * d.Ch) return false;
    gate_fragments(t, acc, row0, m0, n0);
    return true;
  }

  // An output-gate tile (any N) from wgmma's accumulators: the logit (the backward's) and
  // sigmoid(logit) (the forward's), pixel-major fp16, each staged as 16-bit rows by stmatrix
  // (Staged16, 32 KB apiece) and stored 8 channels at a time.
  __device__ void gate_fragments(const EpiTile& t, const float (&acc)[64], int row0, int64_t m0, int n0) const {
    const int64_t M = d.M();
    const int C = static_cast<int>(d.C), c0 = n0 - 4 * static_cast<int>(d.Ch);  // the tile's first channel
    const float* bs = stage_bias(t, bias, n0, static_cast<int>(d.proj_cols()));  // [128], 0 past C
    uint8_t* stage = reinterpret_cast<uint8_t*>(t.c);
    const Staged16 lg{stage}, sg{stage + Cfg::kBlockM * Cfg::kBlockN * 2};  // [128 px][128 ch] each
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // n8 tiles 4q .. 4q + 3: 32 columns
      uint32_t pl[kFragNi][2], ps[kFragNi][2];  // [n8 tile][row half] packed logit, sigmoid pairs
      pack_gate(acc, bs, q, false, pl);
      pack_gate(acc, bs, q, true, ps);
      if (logit) lg.put(0, pl, row0, 32 * q);
      if (gate) sg.put(0, ps, row0, 32 * q);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kStagedChunksPerThread; ++i) {
      const int q = threadIdx.x + i * Cfg::kThreads, r = q / 16, k = q % 16, c = c0 + 8 * k;
      const int64_t m = m0 + r;
      if (m >= M || c >= C) continue;  // C is a multiple of 32: 8 channels are all in or all out
      if (logit) *reinterpret_cast<uint4*>(logit + m * C + c) = lg.get(r, k);
      if (gate) *reinterpret_cast<uint4*>(gate + m * C + c) = sg.get(r, k);
    }
  }

  // The a/b tiles when N % 8 != 0, staged channel-major.
  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int) const {
    project_ab_scalar(t, m0, n0, stage_bias(t, bias, n0, static_cast<int>(d.proj_cols())));
  }

  // Any N: one element per store, the pixel at the end of a matrix row also zeroes its pads.
  __device__ void project_ab_scalar(const EpiTile& t, int64_t m0, int n0, const float* bs) const {
    const int r = threadIdx.x % Cfg::kBlockM;  // fixed row per thread: one mask load
    const int64_t m = m0 + r;
    if (m >= d.M()) return;
    const float mk = mask_at(mask, m, d.N);
    const bool row_end = m % d.N == d.N - 1;
    const int64_t base = cm_offset(d, m, 0), plane = d.plane();
    const int Ch = static_cast<int>(d.Ch), pads = static_cast<int>(d.Np - d.N);
#pragma unroll 4
    for (int c = threadIdx.x / Cfg::kBlockM; c < 64; c += Cfg::kThreads / Cfg::kBlockM) {
      const float p = t.at_cm(r, 2 * c) + bs[2 * c], g = t.at_cm(r, 2 * c + 1) + bs[2 * c + 1];
      const int ch = n0 / 2 + c;
      const int64_t off = (ch < Ch ? ch : ch - Ch) * plane + base;
      const float v = sigmoid(g) * p * mk;
      T* dst = (ch < Ch ? a : b) + off;
      __nv_bfloat16* copy = a_bf ? (ch < Ch ? a_bf : b_bf) + off : nullptr;
      dst[0] = to16<T>(v);
      if (copy) copy[0] = to16<__nv_bfloat16>(v);
      if (row_end)
        for (int j = 1; j <= pads; ++j) {
          dst[j] = to16<T>(0.f);
          if (copy) copy[j] = to16<__nv_bfloat16>(0.f);
        }
    }
  }
};

// The input projection on the TMA loop (gemm_tma.cuh) where N % 8 == 0 (no row pads; 8 pixels
// from a multiple of 8 lie in one matrix row). Output-gate tiles (columns from 4Ch) go
// pixel-major: the logit and/or sigmoid(logit) in fp16, each staged as 16-bit rows by stmatrix in
// the warpgroup's buffer (Staged16's layout, 64 rows) and stored 16 bytes at a time. For the a/b
// tiles, each consumer warpgroup forms
// a = sigmoid(g) p mask for its 64 pixel rows and the tile's 64 channels from its accumulators
// (both logits of channel 4i + t in one thread: acc[4i + 2h], the projection, and
// acc[4i + 2h + 1], the gate, at pixel row 16w + g + 8h; dlin_order.h); stmatrix transposes each
// 8 pixel x 8 channel block as 16-bit values into the warpgroup's buffer [64 channels][64
// pixels], whose 16-byte chunk k of channel i's 128-byte row sits at k ^ (i % 8) (the eight rows
// one stmatrix writes fall in distinct banks); then its lanes store 8 pixels of a channel (16
// bytes) at a time.
template <class T>
struct ProjectTmaEpilogue : ProjectOutputs<T> {
  static constexpr int kBlockN = ProjectTile::kBlockN, kStages = ProjectTile::kStages;
  static constexpr int kConsumers = ProjectTile::kConsumers, kProducerRegs = ProjectTile::kProducerRegs,
                       kConsumerRegs = ProjectTile::kConsumerRegs;
  static constexpr bool kSplitK = false;
  static constexpr int kTileBytes = 64 * 64 * 2;            // [64 channels][64 pixels], 16-bit
  static constexpr int kBufBytes = 2 * kTileBytes + 8 * 8;  // T's tile, the bf16 copy's, 8 chunk offsets
  static constexpr int kBiasBytes = (4 * 256 + 256) * 4;    // the biases, 4Ch + C <= 1280
  static constexpr int kSmemBytes = kBiasBytes + kConsumers * kBufBytes;
  static_assert(2 * kTileBytes == 64 * Cfg::kBlockN * 2, "an output-gate tile's 64 rows fill the two tiles' bytes");
  using Out = ProjectOutputs<T>;
  using Out::d, Out::bias, Out::mask, Out::a, Out::b, Out::a_bf, Out::b_bf, Out::gate, Out::logit;

  __device__ static int cm_chunk(int i, int k) { return i * 128 + ((k ^ (i & 7)) << 4); }  // bytes

  __device__ void start(uint8_t* smem, int) const {
    float* bs = reinterpret_cast<float*>(smem);
    for (int i = threadIdx.x; i < d.proj_cols(); i += 128 * kConsumers) bs[i] = bias[i];
  }
  __device__ void finish(int) const {}

  __device__ void tile(uint8_t* smem, const float (&acc)[1][64], int cw, int64_t m0, int n0, int, int) const {
    const int64_t M = d.M(), r0 = m0 + 64 * cw;  // the warpgroup's first pixel
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, tq = lane & 3;
    const int wt = threadIdx.x % 128;
    const float* bs = reinterpret_cast<const float*>(smem) + n0;  // [128] the tile's biases
    uint8_t* buf = smem + kBiasBytes + cw * kBufBytes;
    if (n0 >= 4 * d.Ch) {
      gate_tile(buf, acc, bs, cw, m0, n0);
      return;
    }
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

  // An output-gate tile: channels n0 - 4Ch + [0, 128) of the warpgroup's 64 pixels, the logit
  // then the gate through the same buffer.
  __device__ void gate_tile(uint8_t* buf, const float (&acc)[1][64], const float* bs, int cw, int64_t m0,
                            int n0) const {
    const int64_t M = d.M(), r0 = m0 + 64 * cw;
    const int C = static_cast<int>(d.C), c0 = n0 - 4 * static_cast<int>(d.Ch);
    const int w = (threadIdx.x / 32) % 4, wt = threadIdx.x % 128;
    const Staged16 st{buf};  // [64 pixels][128 channels] 16-bit
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      __half* out = pass == 0 ? logit : gate;
      if (!out) continue;
      dev::bar_sync(1 + cw, 128);  // the buffer's previous reads are done
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // n8 tiles 4q .. 4q + 3
        uint32_t pk[kFragNi][2];     // [n8 tile][row half] packed pairs
        pack_gate(acc[0], bs, q, pass == 1, pk);
        st.put(0, pk, 16 * w, 32 * q);
      }
      dev::bar_sync(1 + cw, 128);
#pragma unroll
      for (int i = wt; i < 64 * 16; i += 128) {  // 16-byte chunks: pixel i / 16, channels 8 (i % 16) ..
        const int r = i / 16, k = i % 16, c = c0 + 8 * k;
        const int64_t m = r0 + r;
        if (m < M && c < C) *reinterpret_cast<uint4*>(out + m * C + c) = st.get(r, k);
      }
    }
  }
};

// Stores the tile as OutT (row-major, ld) into matrix blockIdx.z; rows/cols bound the store.
// Optionally scales column c by col_scale[c] first (LayerNorm gamma on a gradient product).
// 16-byte stores where the destination allows (VecWalk), element stores otherwise.
template <class OutT>
struct StoreEpilogue {
  OutT* ptr;
  int64_t ld, batch_stride, rows, cols;
  WeightRef col_scale{nullptr, 0, 0};
  static constexpr int kVec = 16 / static_cast<int>(sizeof(OutT));

  // On the wgmma main loop: each thread stores its column pairs straight from registers (8 bytes
  // of fp32 or 4 of 16-bit values; a quad covers 32 or 16 contiguous bytes of a row). ld and
  // cols are even (the buffers' widths are multiples of 8).
  __device__ void wgmma_fragments(const float (&acc)[64], int row0, int64_t m0, int n0, int z) const {
    OutT* base = ptr + z * batch_stride;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < Cfg::kBlockN / 8; ++i) {
      const int64_t c = n0 + 8 * i + 2 * t;
      if (c >= cols) continue;
      const float s0 = col_scale.ptr ? weight_at(col_scale, 0, c) : 1.f;
      const float s1 = col_scale.ptr ? weight_at(col_scale, 0, c + 1) : 1.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + row0 + g + 8 * h;
        if (m >= rows) continue;
        const float v0 = acc[4 * i + 2 * h] * s0, v1 = acc[4 * i + 2 * h + 1] * s1;
        if constexpr (sizeof(OutT) == 4) *reinterpret_cast<float2*>(base + m * ld + c) = make_float2(v0, v1);
        else *reinterpret_cast<uint32_t*>(base + m * ld + c) = dev::MmaOp<OutT>::pack(v0, v1);
      }
    }
  }

  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int z) const {
    OutT* base = ptr + z * batch_stride;
    const VecWalk<kVec> w;
    const int64_t c = n0 + w.col();
    if (c >= cols) return;
    float scale[kVec];  // [column] LayerNorm gamma or 1
#pragma unroll
    for (int e = 0; e < kVec; ++e) scale[e] = col_scale.ptr && c + e < cols ? weight_at(col_scale, 0, c + e) : 1.f;
    const bool vec = ld % kVec == 0 && aligned16(base) && c + kVec <= cols;
#pragma unroll 2
    for (int k = 0; k < w.kItems; ++k) {
      const int64_t m = m0 + w.row(k);
      if (m >= rows) continue;
      float v[kVec];  // [column]
      w.read(t, k, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] *= scale[e];
      OutT* dst = base + m * ld + c;
      if (vec) {
        *reinterpret_cast<uint4*>(dst) = pack16<OutT, kVec>(v);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          if (c + e < cols) {
            if constexpr (kVec == 4) dst[e] = v[e];
            else dst[e] = to16<OutT>(v[e]);
          }
      }
    }
  }
};

// Output projection, forward: out = gate * (LN_out(x) Wzᵀ + bz), from registers: each thread
// reads the gate pairs of its fragment (prefetched into shared memory in Staged16's layout while
// the product runs), the bf16 results go through a Staged16 tile and out in rows of 16-byte
// chunks (element-wise where a strided row is not 16-byte aligned). (Staging the fp32 tile and
// walking it made it shared-memory-instruction bound: MIO throttle and short scoreboard were
// its top stalls.)
struct OutputEpilogue {
  Dims d;
  const float* bias;    // [C]
  const __half* gate;   // [M][C] sigmoid
  PairRef out;        // bf16, or the residual update's rows (res.ptr)
  ResidualRef res;    // ptr nullptr: out is the update

  __device__ bool prefetch(void* extra, int64_t m0, int n0) const {
    const auto row = [&](int r) { return m0 + r < d.M() ? gate + (m0 + r) * d.C : nullptr; };
    stage16_async<__half>(dev::smem_addr(extra), row, n0, d.C);
    return true;
  }

  __device__ void fragments(const EpiTile& t, const AccFragments& acc, int wm, int wn, int64_t m0, int n0) const {
    const int64_t M = d.M();
    const int C = static_cast<int>(d.C), lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    row_offsets(t, [&](int r) { return m0 + r < M ? pair_offset(out, m0 + r, d.N) : int64_t{-1}; });
    float b[kFragNi][2];  // [n8 tile][column of the pair] bias
#pragma unroll
    for (int n = 0; n < kFragNi; ++n) {
      const int c = n0 + wn + 8 * n + 2 * tq;  // C is a multiple of 32: a pair is all in or all out
      b[n][0] = c < C ? bias[c] : 0.f, b[n][1] = c < C ? bias[c + 1] : 0.f;
    }
    const Staged16 st{reinterpret_cast<uint8_t*>(t.c)};
#pragma unroll
    for (int mi = 0; mi < kFragMi; ++mi) {
      uint32_t pk[kFragNi][2];  // [n8 tile][row half] bf16 pairs of out
#pragma unroll
      for (int n = 0; n < kFragNi; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm + 16 * mi + 8 * h + g, c = n0 + wn + 8 * n + 2 * tq;
          const int64_t m = m0 + r;
          float2 s = make_float2(0.f, 0.f);  // the gate pair
          if (t.prefetched) {
            s = __half22float2(*reinterpret_cast<const __half2*>(static_cast<const uint8_t*>(t.extra) +
                                                                 Staged16::chunk_at(r, (wn + 8 * n) / 8) + 4 * tq));
          } else if (m < M && c < C) {
            s = __half22float2(*reinterpret_cast<const __half2*>(gate + m * C + c));
          }
          pk[n][h] = dev::MmaOp<__nv_bfloat16>::pack(s.x * (acc[mi][n][2 * h] + b[n][0]),
                                                     s.y * (acc[mi][n][2 * h + 1] + b[n][1]));
        }
      st.put(mi, pk, wm, wn);
    }
    __syncthreads();
    if (res.ptr) return store_residual(t, st, m0, n0);
    auto* o = static_cast<__nv_bfloat16*>(out.ptr);
#pragma unroll
    for (int i = 0; i < kStagedChunksPerThread; ++i) {
      const int q = threadIdx.x + i * Cfg::kThreads, r = q / 16, k = q % 16, c = n0 + 8 * k;
      if (t.rows[r] < 0 || c >= C) continue;
      const uint4 v = st.get(r, k);
      __nv_bfloat16* dst = o + t.rows[r] + c;
      if (aligned16(dst)) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};  // 2-byte stores (a local array's address would go to the stack)
#pragma unroll
        for (int x = 0; x < 8; ++x)
          dst[x] = __ushort_as_bfloat16(static_cast<unsigned short>(w[x / 2] >> (16 * (x % 2))));
      }
    }
  }

  // out = residual + scale * update from the staged bf16 update, 16-byte chunks of rows.
  __device__ void store_residual(const EpiTile& t, const Staged16& st, int64_t m0, int n0) const {
    const residual::Shape sh{d.B, d.N, d.N, d.C};
#pragma unroll 2
    for (int i = 0; i < kStagedChunksPerThread; ++i) {
      const int q = threadIdx.x + i * Cfg::kThreads, r = q / 16, k = q % 16, c = n0 + 8 * k;
      if (t.rows[r] < 0 || c >= d.C) continue;
      float u[8];  // [channel] the update
      dev::unpack8<__nv_bfloat16>(u, st.get(r, k));
      const int64_t at = t.rows[r] + c;  // out and the residual are contiguous rows alike
      if (res.f32) add_residual<float>(u, sh, at, m0 + r, c);
      else add_residual<__nv_bfloat16>(u, sh, at, m0 + r, c);
    }
  }
  // One chunk with the residual kernel's arithmetic (residual/rows.cuh): bitwise the unfused
  // result.
  template <class T>
  __device__ void add_residual(const float (&u)[8], const residual::Shape& sh, int64_t at, int64_t m, int c) const {
    float x[8], s[8];  // [channel] the residual, the scale
    residual::load8(x, static_cast<const T*>(res.ptr) + at);
    residual::load_scale<__nv_bfloat16>(s, sh, res.scale, m, c);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] += s[e] * u[e];
    residual::store8(static_cast<T*>(out.ptr) + at, x);
  }
};

// Output stage, backward: recomputed y = LN_out(x) Wzᵀ + bz gives dy = dout * s (the output
// projection's upstream gradient) and d(gate logits) = dout * y * s (1 - s), written into the
// gate columns of the input projection's gradient. Per-tile column sums (bias gradients) go to
// fixed slots [m-tile][column]. 8 channels per lane, 16-byte loads and stores. dy goes out as
// bf16 high and low parts (dy = hi + lo to ~16 bits): both of its products take them as one
// operand twice as long, so dy's rounding does not reach d xhat_out and dWz.
template <class T>
struct OutGradEpilogue {
  Dims d;
  const float* bias;    // [C]
  const __half* gate;   // [M][C] logit
  PairRef dout;         // bf16
  T* dy;              // [M][2C]: high parts, then low parts
  T* dgate;           // [M][dgate_ld]: the gate logit's gradient (dlin's gate columns, workspace.h)
  int64_t dgate_ld;
  float* colsum_dy;   // [m-tiles][C]
  float* colsum_lin;  // [m-tiles][4Ch + C]

  // From registers where dout's rows are 16-byte aligned and the gate-logit tile was prefetched
  // (Ch <= 128): the logit tile (extra area) and dout's (after the product, into the tile area)
  // in Staged16's layout; each thread computes its fragment's dy and d logit, and the three
  // 16-bit results (dy high, dy low, d logit) go back through Staged16 tiles over the inputs'
  // bytes (a warp rewrites only the chunks it read) and out in 16-byte row chunks. (The staged
  // path's scalar shared traffic made it MIO-bound, like the output epilogue.)
  __device__ bool dout_vectors() const {
    return aligned16(dout.ptr) && dout.sb % 8 == 0 && dout.si % 8 == 0 && dout.sj % 8 == 0;
  }
  __device__ bool prefetch(void* extra, int64_t m0, int n0) const {
    if (!dout_vectors()) return false;
    const auto row = [&](int r) { return m0 + r < d.M() ? gate + (m0 + r) * d.C : nullptr; };
    stage16_async<__half>(dev::smem_addr(extra), row, n0, d.C);
    return true;
  }

  __device__ bool fragments(const EpiTile& t, const AccFragments& acc, int wm, int wn, int64_t m0, int n0) const {
    if (!t.prefetched) return false;
    const int64_t M = d.M(), gcol = 4 * d.Ch, lds = d.proj_cols();
    const int C = static_cast<int>(d.C), lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const auto* go = static_cast<const __nv_bfloat16*>(dout.ptr);
    row_offsets(t, [&](int r) { return m0 + r < M ? pair_offset(dout, m0 + r, d.N) : int64_t{-1}; });
    const Staged16 hi{reinterpret_cast<uint8_t*>(t.c)};                // dout, then dy's high parts
    const Staged16 lo{reinterpret_cast<uint8_t*>(t.c) + 32768};        // dy's low parts
    const Staged16 dg{static_cast<uint8_t*>(t.extra)};                 // the logit, then its gradient
    static_assert(2 * 32768 <= kEpiTileBytes, "dout and dy's low parts lie before the extra area");
    const auto row = [&](int r) { return t.rows[r] >= 0 ? go + t.rows[r] : nullptr; };
    stage16_async<__nv_bfloat16>(dev::smem_addr(hi.base), row, n0, C);
    dev::cp_async_commit();
    dev::cp_async_wait<0>();
    __syncthreads();
    float b[kFragNi][2];  // [n8 tile][column of the pair] bias
#pragma unroll
    for (int n = 0; n < kFragNi; ++n) {
      const int c = n0 + wn + 8 * n + 2 * tq;  // C is a multiple of 32: a pair is all in or all out
      b[n][0] = c < C ? bias[c] : 0.f, b[n][1] = c < C ? bias[c + 1] : 0.f;
    }
    float sdy[2 * kFragNi] = {}, sdg[2 * kFragNi] = {};  // [2n + e] column sums over this thread's rows
#pragma unroll
    for (int mi = 0; mi < kFragMi; ++mi) {
      uint32_t phi[kFragNi][2], plo[kFragNi][2], pdg[kFragNi][2];  // [n8 tile][row half] packed pairs
#pragma unroll
      for (int n = 0; n < kFragNi; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm + 16 * mi + 8 * h + g, at = Staged16::chunk_at(r, (wn + 8 * n) / 8) + 4 * tq;
          const float2 go2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(hi.base + at));
          const float2 lg2 = __half22float2(*reinterpret_cast<const __half2*>(dg.base + at));
          const float gv[2] = {go2.x, go2.y}, lv[2] = {lg2.x, lg2.y};
          float vdy[2], vdg[2], vlo[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float sg = sigmoid(lv[e]), yy = acc[mi][n][2 * h + e] + b[n][e];
            vdy[e] = gv[e] * sg, vdg[e] = gv[e] * yy * sg * (1.f - sg);
            sdy[2 * n + e] += vdy[e], sdg[2 * n + e] += vdg[e];
            vlo[e] = vdy[e] - dev::to_float(dev::from_float<T>(vdy[e]));
          }
          phi[n][h] = dev::MmaOp<T>::pack(vdy[0], vdy[1]);
          plo[n][h] = dev::MmaOp<T>::pack(vlo[0], vlo[1]);
          pdg[n][h] = dev::MmaOp<T>::pack(vdg[0], vdg[1]);
        }
      __syncwarp();  // this warp's reads of these rows' chunks come before its rewrites of them
      hi.put(mi, phi, wm, wn);
      lo.put(mi, plo, wm, wn);
      dg.put(mi, pdg, wm, wn);
    }
    __syncthreads();
#pragma unroll 2
    for (int i = 0; i < kStagedChunksPerThread; ++i) {
      const int q = threadIdx.x + i * Cfg::kThreads, r = q / 16, k = q % 16, c = n0 + 8 * k;
      const int64_t m = m0 + r;
      if (m >= M || c >= C) continue;
      *reinterpret_cast<uint4*>(dy + m * 2 * C + c) = hi.get(r, k);
      *reinterpret_cast<uint4*>(dy + m * 2 * C + C + c) = lo.get(r, k);
      *reinterpret_cast<uint4*>(dgate + m * dgate_ld + c) = dg.get(r, k);
    }
    const int64_t mt = m0 / Cfg::kBlockM;
    const int cn = n0 + static_cast<int>(threadIdx.x);
    auto col = [&](int i) { return wn + 8 * (i / 2) + 2 * tq + i % 2; };
    const float tdy = fragment_column_sums(t, sdy, wm, col);
    if (threadIdx.x < Cfg::kBlockN && cn < C) colsum_dy[mt * C + cn] = tdy;
    const float tdg = fragment_column_sums(t, sdg, wm, col);
    if (threadIdx.x < Cfg::kBlockN && cn < C) colsum_lin[mt * lds + gcol + cn] = tdg;
    return true;
  }

  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int) const {
    const auto* go = static_cast<const __nv_bfloat16*>(dout.ptr);
    const int64_t gcol = 4 * d.Ch, lds = d.proj_cols();
    row_offsets(t, [&](int r) { return m0 + r < d.M() ? pair_offset(dout, m0 + r, d.N) : 0; });
    const VecWalk<8> w;
    const int c = n0 + w.col();
    const bool in = c < d.C;  // C is a multiple of 32: a group is all in or all out
    float sum_dy[8] = {}, sum_dg[8] = {};  // [channel] over this lane's rows
    if (in) {
      float bc[8];  // [channel]
#pragma unroll
      for (int e = 0; e < 8; ++e) bc[e] = bias[c + e];
#pragma unroll 2
      for (int k = 0; k < w.kItems; ++k) {
        const int r = w.row(k);
        const int64_t m = m0 + r;
        if (m >= d.M()) continue;
        float y[8], s[8], g[8];  // [channel] recomputed y, gate logit, dout
        w.read(t, k, y);
        dev::unpack8<__half>(s, *reinterpret_cast<const uint4*>(gate + m * d.C + c));
        const __nv_bfloat16* src = go + t.rows[r] + c;
        if (aligned16(src)) {
          dev::unpack8<__nv_bfloat16>(g, *reinterpret_cast<const uint4*>(src));
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) g[e] = __bfloat162float(src[e]);
        }
        float vdy[8], vdg[8];  // [channel]
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float sg = sigmoid(s[e]), yy = y[e] + bc[e];
          vdy[e] = g[e] * sg, vdg[e] = g[e] * yy * sg * (1.f - sg);
          sum_dy[e] += vdy[e], sum_dg[e] += vdg[e];
        }
        float lo[8];  // [channel] what the bf16 high part leaves
#pragma unroll
        for (int e = 0; e < 8; ++e) lo[e] = vdy[e] - dev::to_float(dev::from_float<T>(vdy[e]));
        *reinterpret_cast<uint4*>(dy + m * 2 * d.C + c) = pack16<T>(vdy);
        *reinterpret_cast<uint4*>(dy + m * 2 * d.C + d.C + c) = pack16<T>(lo);
        *reinterpret_cast<uint4*>(dgate + m * dgate_ld + c) = pack16<T>(vdg);
      }
    }
    const int64_t mt = m0 / Cfg::kBlockM;
    const int cn = n0 + static_cast<int>(threadIdx.x);
    const float tdy = vector_column_sums(t, w, sum_dy);
    if (threadIdx.x < Cfg::kBlockN && cn < d.C) colsum_dy[mt * d.C + cn] = tdy;
    const float tdg = vector_column_sums(t, w, sum_dg);
    if (threadIdx.x < Cfg::kBlockN && cn < d.C) colsum_lin[mt * lds + gcol + cn] = tdg;
  }
};

// Input projection, backward (a/b columns only): from the recomputed p, g and the upstream da
// (db), d p = da * sigmoid(g) * mask and d g = da * p * mask * s (1 - s), written pixel-major in
// dlin's a/b column order (dlin_order.h) as bf16 high and low parts, plus per-tile column sums.
// It works on the accumulators in registers: wcat puts each channel's projection and gate in
// neighbouring columns, i.e. in one thread's C fragment. (Staging the
// tile through shared memory made it shared-memory-instruction bound: ~350 shared accesses per
// thread per tile, MIO throttle the top stall at 1.6 TB/s.)
template <class T>
struct ProjectBackwardEpilogue {
  Dims d;
  const float* bias;     // [4Ch + C] in wcat's order
  MaskRef mask;
  const float *da, *db;  // channel-major
  T* dlin;               // [M][P + 4Ch]: high parts, then the a/b columns' low parts at P + column
  float* colsum_lin;     // [m-tiles][4Ch + C]
  int64_t dlin_row0 = 0;  // the pixel row dlin's first row holds (a chunk of the pixels)

  // The prefetched da/db tile: [64 channels][128 pixels] fp32 (layout.h's swizzle).
  __device__ static int pre_index(int c, int r) { return da_tile_index<Cfg::kBlockM>(c, r); }

  // da/db of the tile's 64 channels x 128 pixels into the extra area while the product runs
  // (N % 8 == 0: 4-pixel chunks are 16-byte aligned and inside one batch).
  __device__ bool prefetch(void* extra, int64_t m0, int n0) const {
    if (d.N % 8 != 0) return false;
    const int q = threadIdx.x % 32;  // 4-pixel chunk
    const int64_t m = m0 + 4 * q;
    const bool in = m < d.M();  // M % 64 == 0 here: a chunk is all in or all out
    const int64_t base = in ? cm_offset(d, m, 0) : 0, plane = d.plane();
    const int Ch = static_cast<int>(d.Ch), cb = n0 / 2;
    const uint32_t s = dev::smem_addr(extra);
#pragma unroll
    for (int i = 0; i < 64 / (Cfg::kThreads / 32); ++i) {
      const int c = static_cast<int>(threadIdx.x / 32) + (Cfg::kThreads / 32) * i, ch = cb + c;
      const float* src = (ch < Ch ? da + ch * plane : db + (ch - Ch) * plane) + base;
      dev::cp_async_16(s + pre_index(c, 4 * q) * 4, src, in);  // out of range: zero fill
    }
    return true;
  }

  // Thread (g, t) of the warp at (wm, wn) holds, for rows wm + 16 mi + g (+ 8), the projection
  // and gate logits of channels n0 / 2 + wn / 2 + 4 n + t (n < 4): acc[mi][n][0, 1] (rows + 8:
  // [2, 3]).
  __device__ void fragments(const EpiTile& t, const AccFragments& acc, int wm, int wn, int64_t m0, int n0) const {
    const int64_t M = d.M(), ldl = d.dlin_cols(), lds = d.proj_cols(), plane = d.plane();
    const int Ch = static_cast<int>(d.Ch), lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    float* row_mask = t.scratch;  // [128] the mask at each row (0 past M)
    if (threadIdx.x < Cfg::kBlockM) {
      const int64_t m = m0 + threadIdx.x;
      row_mask[threadIdx.x] = m < M ? mask_at(mask, m, d.N) : 0.f;
      if (!t.prefetched) t.rows[threadIdx.x] = m < M ? cm_offset(d, m, 0) : -1;
    }
    __syncthreads();
    float bp[kFragNi], bg[kFragNi];    // [n8 tile] this thread's channels' projection and gate biases
    const float* up_src[kFragNi];      // [n8 tile] its channel's da or db plane
#pragma unroll
    for (int n = 0; n < kFragNi; ++n) {
      const int i = wn / 2 + 4 * n + tq, ch = n0 / 2 + i;
      bp[n] = bias[n0 + 2 * i];
      bg[n] = bias[n0 + 2 * i + 1];
      up_src[n] = ch < Ch ? da + ch * plane : db + (ch - Ch) * plane;
    }
    const float* pre = static_cast<const float*>(t.extra);
    float sum[2 * kFragNi] = {};  // [column of the 16-byte group] over this thread's rows
#pragma unroll
    for (int mi = 0; mi < kFragMi; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm + 16 * mi + g + 8 * h;
        const int64_t m = m0 + r;
        const float mk = row_mask[r];
        float v[2 * kFragNi], lo[2 * kFragNi];  // [2 n + e] the group's values; their low parts
#pragma unroll
        for (int n = 0; n < kFragNi; ++n) {
          const int i = wn / 2 + 4 * n + tq;
          float up;
          if (t.prefetched) {
            up = pre[pre_index(i, r)];
          } else {
            const int64_t base = t.rows[r];
            up = base >= 0 ? up_src[n][base] : 0.f;
          }
          up *= mk;
          const float p = acc[mi][n][2 * h] + bp[n], s = sigmoid(acc[mi][n][2 * h + 1] + bg[n]);
          v[2 * n] = up * s;
          v[2 * n + 1] = up * p * s * (1.f - s);
        }
#pragma unroll
        for (int e = 0; e < 2 * kFragNi; ++e) sum[e] += v[e], lo[e] = v[e] - dev::to_float(dev::from_float<T>(v[e]));
        if (m < M) {
          T* row = dlin + (m - dlin_row0) * ldl + n0 + wn + 8 * tq;
          *reinterpret_cast<uint4*>(row) = dev::pack8<T>(v);
          *reinterpret_cast<uint4*>(row + lds) = dev::pack8<T>(lo);
        }
      }
    const float tot = fragment_column_sums(t, sum, wm, [&](int e) { return wn + 8 * tq + e; });
    if (threadIdx.x < Cfg::kBlockN) colsum_lin[(m0 / Cfg::kBlockM) * lds + n0 + threadIdx.x] = tot;
  }
};

}  // namespace tpf::trimul
