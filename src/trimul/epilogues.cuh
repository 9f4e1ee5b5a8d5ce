// GEMM epilogues of the multiplicative-update stages: what each product's fp32 tile becomes.
#pragma once
#include "trimul/gemm.cuh"
#include "trimul/layout.h"

namespace tpf::trimul {

// 1 / (1 + e^-x): relatively accurate in both tails (a saturated gate's s and s(1 - s) keep
// their digits). Not 0.5 tanh(x/2) + 0.5: tanh.approx's absolute error (~2^-11) would swamp s
// and s(1 - s) for |x| > ~6, i.e. exactly the saturated gates of a trained model.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

// Rows of the tile at m0 that lie inside [0, M).
__device__ __forceinline__ int tile_rows(int64_t m0, int64_t M) {
  return static_cast<int>(M - m0 < Cfg::kBlockM ? M - m0 : Cfg::kBlockM);
}

// Loads the tile's 128 bias values into the scratch area (bias[n0 + n], zero past `count`).
// Synchronises; the scratch is then read-only until the epilogue's first column_sums.
__device__ __forceinline__ const float* stage_bias(const EpiTile& t, const float* bias, int n0,
                                                   int count) {
  if (threadIdx.x < Cfg::kBlockN)
    t.scratch[threadIdx.x] = n0 + static_cast<int>(threadIdx.x) < count ? bias[n0 + threadIdx.x] : 0.f;
  __syncthreads();
  return t.scratch;
}

template <class T>
__device__ __forceinline__ T to16(float v) { return dev::from_float<T>(v); }

// Input projection, forward. Columns of the concatenated weight come in groups of 128: 64
// projection rows then the 64 gate rows of the same channels (of [a | b], 2Ch channels), so one
// tile holds both factors of a = sigmoid(g) * p * mask; after the 4Ch a/b columns come the C
// output-gate columns. a and b go channel-major (the triangle product's operands), the output
// gate pixel-major in fp16: sigmoid(logit) for the forward, the logit itself for the backward.
template <class T>
struct ProjectEpilogue {
  Dims d;
  const float* bias;  // [4Ch + C], LayerNorm beta folded in
  MaskRef mask;
  T *a, *b;           // channel-major
  __half* gate;       // [M][C]
  bool gate_logit;
  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int) const {
    const int64_t M = d.M();
    const float* bs = stage_bias(t, bias, n0, static_cast<int>(d.proj_cols()));  // [128] this tile's
    if (n0 < 4 * d.Ch) {
      const int r = threadIdx.x % Cfg::kBlockM;  // fixed row per thread: one mask load
      const int64_t m = m0 + r;
      if (m >= M) return;
      const float mk = mask_at(mask, m, d.N);
      const bool row_end = m % d.N == d.N - 1;  // this pixel also zeroes the row's pads
      const int64_t base = cm_offset(d, m, 0), plane = d.plane();
      const int Ch = static_cast<int>(d.Ch), pads = static_cast<int>(d.Np - d.N);
#pragma unroll 4
      for (int c = threadIdx.x / Cfg::kBlockM; c < 64; c += Cfg::kThreads / Cfg::kBlockM) {
        const float p = t.at(r, c) + bs[c], g = t.at(r, 64 + c) + bs[64 + c];
        const int ch = n0 / 2 + c;
        T* dst = (ch < Ch ? a + ch * plane : b + (ch - Ch) * plane) + base;
        dst[0] = to16<T>(sigmoid(g) * p * mk);
        if (row_end)
          for (int j = 1; j <= pads; ++j) dst[j] = to16<T>(0.f);
      }
    } else {
      const int col0 = n0 - 4 * static_cast<int>(d.Ch);
      const int col = col0 + static_cast<int>(threadIdx.x) % Cfg::kBlockN;
      const float bn = bs[threadIdx.x % Cfg::kBlockN];
      __half* g = gate + m0 * d.C + col;
      for_each_row_major([&](int r, int n) {
        if (m0 + r < M && col < d.C) {
          const float l = t.at(r, n) + bn;
          g[r * d.C] = __float2half_rn(gate_logit ? l : sigmoid(l));
        }
      });
    }
  }
};

// Stores the tile as OutT (row-major, ld) into matrix blockIdx.z; rows/cols bound the store.
// Optionally scales column c by col_scale[c] first (LayerNorm gamma on a gradient product).
template <class OutT>
struct StoreEpilogue {
  OutT* ptr;
  int64_t ld, batch_stride, rows, cols;
  WeightRef col_scale{nullptr, 0, 0};
  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int z) const {
    OutT* base = ptr + z * batch_stride;
    const int64_t c = n0 + threadIdx.x % Cfg::kBlockN;  // for_each_row_major keeps the column
    const float scale = col_scale.ptr && c < cols ? weight_at(col_scale, 0, c) : 1.f;
    for_each_row_major([&](int r, int n) {
      const int64_t m = m0 + r;
      if (m < rows && c < cols) {
        if constexpr (sizeof(OutT) == 4) base[m * ld + c] = t.at(r, n) * scale;
        else base[m * ld + c] = to16<OutT>(t.at(r, n) * scale);
      }
    });
  }
};

// Output projection, forward: out = gate * (LN_out(x) Wzᵀ + bz).
struct OutputEpilogue {
  Dims d;
  const float* bias;    // [C]
  const __half* gate;   // [M][C] sigmoid
  PairRef out;        // bf16
  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int) const {
    auto* o = static_cast<__nv_bfloat16*>(out.ptr);
    row_offsets(t, [&](int r) { return m0 + r < d.M() ? pair_offset(out, m0 + r, d.N) : 0; });
    const int c = n0 + static_cast<int>(threadIdx.x) % Cfg::kBlockN;
    const float bc = c < d.C ? bias[c] : 0.f;
    const __half* g = gate + m0 * d.C + c;
    const int rows = tile_rows(m0, d.M());
    for_each_row_major_prefetched<16>(
        [&](int r) { return r < rows && c < d.C ? __half2float(g[r * d.C]) : 0.f; },
        [&](int r, int n, float s) {
          if (r < rows && c < d.C) o[t.rows[r] + c] = __float2bfloat16_rn(s * (t.at(r, n) + bc));
        });
  }
};

// Output stage, backward: recomputed y = LN_out(x) Wzᵀ + bz gives dy = dout * s (the output
// projection's upstream gradient) and d(gate logits) = dout * y * s (1 - s), written into the
// gate columns of the input projection's gradient. Per-tile column sums (bias gradients) go to
// fixed slots [m-tile][column].
template <class T>
struct OutGradEpilogue {
  Dims d;
  const float* bias;    // [C]
  const __half* gate;   // [M][C] logit
  PairRef dout;         // bf16
  T* dy;              // [M][C]
  T* dlin;            // [M][4Ch + C]
  float* colsum_dy;   // [m-tiles][C]
  float* colsum_lin;  // [m-tiles][4Ch + C]
  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int) const {
    const auto* go = static_cast<const __nv_bfloat16*>(dout.ptr);
    const int64_t ldl = d.proj_cols(), gcol = 4 * d.Ch;
    float sum_dy = 0.f, sum_dg = 0.f;
    row_offsets(t, [&](int r) { return m0 + r < d.M() ? pair_offset(dout, m0 + r, d.N) : 0; });
    const int cc = n0 + static_cast<int>(threadIdx.x) % Cfg::kBlockN;
    const float bc = cc < d.C ? bias[cc] : 0.f;
    const int rows = tile_rows(m0, d.M());
    const __half* gt = gate + m0 * d.C + cc;
    T* dyp = dy + m0 * d.C + cc;
    T* dgp = dlin + m0 * ldl + gcol + cc;
    for_each_row_major_prefetched<16>(
        [&](int r) {
          return r < rows && cc < d.C
                     ? make_float2(__half2float(gt[r * d.C]), __bfloat162float(go[t.rows[r] + cc]))
                     : make_float2(0.f, 0.f);
        },
        [&](int r, int n, float2 v) {
      if (r < rows && cc < d.C) {
        const float s = sigmoid(v.x), y = t.at(r, n) + bc, g = v.y;
        const float vdy = g * s, vdg = g * y * s * (1.f - s);
        dyp[r * d.C] = to16<T>(vdy);
        dgp[r * ldl] = to16<T>(vdg);
        sum_dy += vdy;
        sum_dg += vdg;
      }
    });
    const int64_t mt = m0 / Cfg::kBlockM;
    const int c = n0 + static_cast<int>(threadIdx.x);
    const float tdy = column_sums(t, sum_dy);
    if (threadIdx.x < Cfg::kBlockN && c < d.C) colsum_dy[mt * d.C + c] = tdy;
    const float tdg = column_sums(t, sum_dg);
    if (threadIdx.x < Cfg::kBlockN && c < d.C) colsum_lin[mt * ldl + gcol + c] = tdg;
  }
};

// Input projection, backward (a/b columns only): from the recomputed p, g and the upstream da
// (db), d p = da * sigmoid(g) * mask and d g = da * p * mask * s (1 - s), written pixel-major at
// the same columns as the concatenated weight, plus per-tile column sums.
template <class T>
struct ProjectBackwardEpilogue {
  Dims d;
  const float* bias;
  MaskRef mask;
  const float *da, *db;  // channel-major
  T* dlin;            // [M][4Ch + C]
  float* colsum_lin;  // [m-tiles][4Ch + C]
  __device__ void operator()(const EpiTile& t, int64_t m0, int n0, int) const {
    const int64_t M = d.M(), ldl = d.proj_cols();
    const float* bs = stage_bias(t, bias, n0, static_cast<int>(ldl));  // [128] this tile's
    {
      const int r = threadIdx.x % Cfg::kBlockM;
      const int64_t m = m0 + r;
      const float mk = m < M ? mask_at(mask, m, d.N) : 0.f;
      const int64_t base = m < M ? cm_offset(d, m, 0) : 0, plane = d.plane();
      const int Ch = static_cast<int>(d.Ch);
      constexpr int kStep = Cfg::kThreads / Cfg::kBlockM, kPer = 64 / kStep;
      const int c0 = threadIdx.x / Cfg::kBlockM;
      float ups[kPer];  // [channels of this thread] da/db at its pixel: loads in flight together
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int ch = n0 / 2 + c0 + i * kStep;
        ups[i] = m < M ? (ch < Ch ? da + ch * plane : db + (ch - Ch) * plane)[base] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = c0 + i * kStep;
        float dp = 0.f, dg = 0.f;
        if (m < M) {
          const float p = t.at(r, c) + bs[c], g = t.at(r, 64 + c) + bs[64 + c];
          const float up = ups[i] * mk;
          const float s = sigmoid(g);
          dp = up * s;
          dg = up * p * s * (1.f - s);
        }
        t.at(r, c) = dp;
        t.at(r, 64 + c) = dg;
      }
    }
    __syncthreads();
    float sum = 0.f;
    const int rows = tile_rows(m0, M);
    T* out = dlin + m0 * ldl + n0 + threadIdx.x % Cfg::kBlockN;
    for_each_row_major([&](int r, int n) {
      if (r < rows) {
        out[r * ldl] = to16<T>(t.at(r, n));
        sum += t.at(r, n);
      }
    });
    const float tot = column_sums(t, sum);
    if (threadIdx.x < Cfg::kBlockN) colsum_lin[(m0 / Cfg::kBlockM) * ldl + n0 + threadIdx.x] = tot;
  }
};

}  // namespace tpf::trimul
