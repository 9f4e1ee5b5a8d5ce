// Weight preparation (LayerNorm folding) and the weight-gradient finalisation. Tiny kernels:
// O(weights) work, fp32 math, fixed summation orders.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/mma.cuh"
#include "trimul/kernels.h"

namespace tpf::trimul {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ void store_any(const WeightRef& w, int64_t off, float v) {
  if (static_cast<DType>(w.dtype) == DType::kFP32) static_cast<float*>(const_cast<void*>(w.ptr))[off] = v;
  else static_cast<__nv_bfloat16*>(const_cast<void*>(w.ptr))[off] = __float2bfloat16_rn(v);
}

// Row o of the concatenated input weight: which weight matrix and which of its rows. Groups of
// 128 rows: 64 projection rows then the 64 gate rows of the same channels; then the C rows of
// the output gate.
struct Source {
  int weight, row;
};
__device__ __forceinline__ Source wcat_source(int o, int Ch) {
  if (o < 4 * Ch) {
    const int q = o / 128, w = o % 128;
    return {w < 64 ? kPInW : kGInW, q * 64 + w % 64};
  }
  return {kGOutW, o - 4 * Ch};
}

// One thread per folded row: [4Ch + C rows of wcat][C rows of Wz].
template <class T>
__global__ void prep_kernel(WeightSet ws, Dims d, T* wcat, float* bcat, T* wz, float* bz) {
  const int o = blockIdx.x * kThreads + threadIdx.x;
  const int ncat = static_cast<int>(d.proj_cols());
  if (o >= ncat + d.C) return;
  const bool in = o < ncat;
  const Source src = in ? wcat_source(o, static_cast<int>(d.Ch)) : Source{kPOutW, o - ncat};
  const WeightRef &W = ws.w[src.weight], &bias = ws.w[src.weight + 1];
  const WeightRef &gamma = ws.w[in ? kNormInW : kNormOutW], &beta = ws.w[in ? kNormInB : kNormOutB];
  const int K = static_cast<int>(in ? d.C : d.Ch);
  T* dst = in ? wcat + int64_t(o) * K : wz + int64_t(o - ncat) * K;
  float b = weight_at(bias, 0, src.row);
  for (int c = 0; c < K; ++c) {
    const float w = weight_at(W, src.row, c);
    dst[c] = dev::from_float<T>(w * weight_at(gamma, 0, c));
    b += w * weight_at(beta, 0, c);
  }
  (in ? bcat[o] : bz[o - ncat]) = b;
}

__global__ void sum_partials_kernel(const float* part, int64_t count, int64_t parts, float* out) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= count) return;
  float s = 0.f;
  for (int64_t i = 0; i < parts; ++i) s += part[i * count + e];
  out[e] = s;
}

// dW[row][c] = G[o][c] gamma[c] + S[o] beta[c] and dbias[row] = S[o], for every weight row.
__global__ void finalize_rows_kernel(WeightSet ws, WeightSet dws, Dims d, const float* g_in,
                                     const float* s_in, const float* g_out, const float* s_out) {
  const int o = blockIdx.x * kThreads + threadIdx.x;
  const int ncat = static_cast<int>(d.proj_cols());
  if (o >= ncat + d.C) return;
  const bool in = o < ncat;
  const Source src = in ? wcat_source(o, static_cast<int>(d.Ch)) : Source{kPOutW, o - ncat};
  const int K = static_cast<int>(in ? d.C : d.Ch);
  const float* G = in ? g_in + int64_t(o) * K : g_out + int64_t(o - ncat) * K;
  const float S = in ? s_in[o] : s_out[o - ncat];
  const WeightRef &gamma = ws.w[in ? kNormInW : kNormOutW], &beta = ws.w[in ? kNormInB : kNormOutB];
  const WeightRef &dW = dws.w[src.weight], &db = dws.w[src.weight + 1];
  if (dW.ptr)
    for (int c = 0; c < K; ++c)
      store_any(dW, src.row * dW.s0 + c, G[c] * weight_at(gamma, 0, c) + S * weight_at(beta, 0, c));
  if (db.ptr) store_any(db, src.row, S);
}

// d gamma[c] = sum_o W[o][c] G[o][c], d beta[c] = sum_o W[o][c] S[o] over every row o that
// reads the normalised input (both LayerNorms: one thread per channel).
__global__ void finalize_norm_kernel(WeightSet ws, WeightSet dws, Dims d, const float* g_in,
                                     const float* s_in, const float* g_out, const float* s_out) {
  const int t = blockIdx.x * kThreads + threadIdx.x;
  if (t >= d.C + d.Ch) return;
  const bool in = t < d.C;
  const int c = in ? t : t - static_cast<int>(d.C);
  const int K = static_cast<int>(in ? d.C : d.Ch);
  const int rows = static_cast<int>(in ? d.proj_cols() : d.C);
  float dg = 0.f, dbeta = 0.f;
  for (int o = 0; o < rows; ++o) {
    const Source src = in ? wcat_source(o, static_cast<int>(d.Ch)) : Source{kPOutW, o};
    const float w = weight_at(ws.w[src.weight], src.row, c);
    dg += w * (in ? g_in : g_out)[int64_t(o) * K + c];
    dbeta += w * (in ? s_in : s_out)[o];
  }
  const WeightRef &dgamma = dws.w[in ? kNormInW : kNormOutW], &dbe = dws.w[in ? kNormInB : kNormOutB];
  if (dgamma.ptr) store_any(dgamma, c, dg);
  if (dbe.ptr) store_any(dbe, c, dbeta);
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t prep_weights(const Problem& p, Operand16 t, void* wcat, float* bcat, void* wz,
                         float* bz, cudaStream_t s) {
  const unsigned g = blocks(p.d.proj_cols() + p.d.C);
  if (t == Operand16::kFP16)
    prep_kernel<<<g, kThreads, 0, s>>>(p.w, p.d, static_cast<__half*>(wcat), bcat, static_cast<__half*>(wz), bz);
  else
    prep_kernel<<<g, kThreads, 0, s>>>(p.w, p.d, static_cast<__nv_bfloat16*>(wcat), bcat, static_cast<__nv_bfloat16*>(wz), bz);
  return cudaGetLastError();
}

cudaError_t sum_partials(const float* part, int64_t count, int64_t parts, float* out,
                         cudaStream_t s) {
  sum_partials_kernel<<<blocks(count), kThreads, 0, s>>>(part, count, parts, out);
  return cudaGetLastError();
}

cudaError_t finalize_weight_grads(const Problem& p, const float* g_in, const float* s_in,
                                  const float* g_out, const float* s_out, cudaStream_t s) {
  finalize_rows_kernel<<<blocks(p.d.proj_cols() + p.d.C), kThreads, 0, s>>>(p.w, p.dw, p.d, g_in, s_in, g_out, s_out);
  finalize_norm_kernel<<<blocks(p.d.C + p.d.Ch), kThreads, 0, s>>>(p.w, p.dw, p.d, g_in, s_in, g_out, s_out);
  return cudaGetLastError();
}

}  // namespace tpf::trimul
