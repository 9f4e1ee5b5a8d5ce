// GEMM epilogues of the multiplicative-update stages: what each product's fp32 tile becomes.
#pragma once
#include "trimul/gemm.cuh"
#include "trimul/layout.h"

namespace tpf::trimul {

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

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
    if (n0 < 4 * d.Ch) {
      const int r = threadIdx.x % Cfg::kBlockM;  // fixed row per thread: one mask load
      const int64_t m = m0 + r;
      if (m >= M) return;
      const float mk = mask_at(mask, m, d.N);
      const bool row_end = m % d.N == d.N - 1;  // this pixel also zeroes the row's pads
      const int64_t base = cm_offset(d, m, 0);
      for (int c = threadIdx.x / Cfg::kBlockM; c < 64; c += Cfg::kThreads / Cfg::kBlockM) {
        const float p = t.at(r, c) + bias[n0 + c], g = t.at(r, 64 + c) + bias[n0 + 64 + c];
        const int ch = n0 / 2 + c, Ch = static_cast<int>(d.Ch);
        T* dst = (ch < Ch ? a + base + ch * d.plane() : b + base + (ch - Ch) * d.plane());
        dst[0] = to16<T>(sigmoid(g) * p * mk);
        if (row_end)
          for (int64_t j = 1; j < d.Np - d.N + 1; ++j) dst[j] = to16<T>(0.f);
      }
    } else {
      const int col0 = n0 - 4 * static_cast<int>(d.Ch);
      for_each_row_major([&](int r, int n) {
        const int64_t m = m0 + r;
        if (m < M && col0 + n < d.C) {
          const float l = t.at(r, n) + bias[n0 + n];
          gate[m * d.C + col0 + n] = __float2half_rn(gate_logit ? l : sigmoid(l));
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
    for_each_row_major([&](int r, int n) {
      const int64_t m = m0 + r;
      const int c = n0 + n;
      if (m < d.M() && c < d.C) {
        const float s = dev::to_float(gate[m * d.C + c]);
        o[t.rows[r] + c] = __float2bfloat16_rn(s * (t.at(r, n) + bias[c]));
      }
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
    for_each_row_major([&](int r, int n) {
      const int64_t m = m0 + r;
      const int c = n0 + n;
      if (m < d.M() && c < d.C) {
        const float s = sigmoid(__half2float(gate[m * d.C + c])), y = t.at(r, n) + bias[c];
        const float g = __bfloat162float(go[t.rows[r] + c]);
        const float vdy = g * s, vdg = g * y * s * (1.f - s);
        dy[m * d.C + c] = to16<T>(vdy);
        dlin[m * ldl + gcol + c] = to16<T>(vdg);
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
    {
      const int r = threadIdx.x % Cfg::kBlockM;
      const int64_t m = m0 + r;
      const float mk = m < M ? mask_at(mask, m, d.N) : 0.f;
      const int64_t base = m < M ? cm_offset(d, m, 0) : 0;
      for (int c = threadIdx.x / Cfg::kBlockM; c < 64; c += Cfg::kThreads / Cfg::kBlockM) {
        float dp = 0.f, dg = 0.f;
        if (m < M) {
          const float p = t.at(r, c) + bias[n0 + c], g = t.at(r, 64 + c) + bias[n0 + 64 + c];
          const int ch = n0 / 2 + c, Ch = static_cast<int>(d.Ch);
          const float up = (ch < Ch ? da[base + ch * d.plane()] : db[base + (ch - Ch) * d.plane()]) * mk;
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
    for_each_row_major([&](int r, int n) {
      const int64_t m = m0 + r;
      if (m < M) {
        dlin[m * ldl + n0 + n] = to16<T>(t.at(r, n));
        sum += t.at(r, n);
      }
    });
    const float tot = column_sums(t, sum);
    if (threadIdx.x < Cfg::kBlockN) colsum_lin[(m0 / Cfg::kBlockM) * ldl + n0 + threadIdx.x] = tot;
  }
};

}  // namespace tpf::trimul
