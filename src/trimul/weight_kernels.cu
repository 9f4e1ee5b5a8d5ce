// Weight preparation (LayerNorm folding) and the weight-gradient finalisation. Tiny kernels:
// O(weights) work, fp32 math, fixed summation orders.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/mma.cuh"
#include "trimul/dlin_order.h"
#include "trimul/kernels.h"

namespace tpf::trimul {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ void store_any(const WeightRef& w, int64_t off, float v) {
  if (static_cast<DType>(w.dtype) == DType::kFP32) static_cast<float*>(const_cast<void*>(w.ptr))[off] = v;
  else static_cast<__nv_bfloat16*>(const_cast<void*>(w.ptr))[off] = __float2bfloat16_rn(v);
}

// Row o of the concatenated input weight: which weight matrix and which of its rows. Groups of
// 128 rows for 64 channels, each channel's projection row then its gate row (dlin_order.h);
// then the C rows of the output gate.
struct Source {
  int weight, row;
};
__device__ __forceinline__ Source wcat_source(int o, int Ch) {
  if (o < 4 * Ch) {
    return {o % 2 ? kGInW : kPInW, o / 2};
  }
  return {kGOutW, o - 4 * Ch};
}

// One warp per folded row ([4Ch + C rows of wcat][C rows of Wz]), lanes over its columns; the
// folded bias's dot product with beta sums in a fixed shuffle tree. (One thread per row walked
// its 128 columns serially: ~80 us of dependent loads on every forward call.)
constexpr int kPrepRowsPerBlock = kThreads / 32;
__global__ void __launch_bounds__(kThreads)
    prep_kernel(WeightSet ws, Dims d, __half* wcat, float* bcat, __half* wz, float* bz,
                __nv_bfloat16* wcat_raw, __nv_bfloat16* wz_raw) {
  const int o = blockIdx.x * kPrepRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x & 31;
  const int ncat = static_cast<int>(d.proj_cols());
  if (o >= ncat + d.C) return;  // whole warps leave together
  const bool in = o < ncat;
  const Source src = in ? wcat_source(o, static_cast<int>(d.Ch)) : Source{kPOutW, o - ncat};
  const WeightRef &W = ws.w[src.weight], &bias = ws.w[src.weight + 1];
  const WeightRef &gamma = ws.w[in ? kNormInW : kNormOutW], &beta = ws.w[in ? kNormInB : kNormOutB];
  const int K = static_cast<int>(in ? d.C : d.Ch);
  const int64_t row = in ? o : o - ncat;
  const bool ab = in && row < 4 * d.Ch;
  const int64_t raw_row = in ? dlin_col(row, d.Ch) : row;  // wcat_raw's rows follow dlin's columns
  __half* dst = (in ? wcat : wz) + row * K;
  __nv_bfloat16* raw = in ? wcat_raw : wz_raw;
  float b = 0.f;
  for (int c = lane; c < K; c += 32) {
    const float w = weight_at(W, src.row, c);
    dst[c] = __float2half_rn(w * weight_at(gamma, 0, c));
    if (raw) raw[raw_row * K + c] = __float2bfloat16_rn(w);
    if (raw && !in) raw[(raw_row + d.C) * K + c] = __float2bfloat16_rn(w);  // Wz again: dy's low parts
    if (raw && ab) raw[(raw_row + ncat) * K + c] = __float2bfloat16_rn(w);  // a/b rows again: dlin's low parts
    b += w * weight_at(beta, 0, c);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) b += __shfl_xor_sync(0xffffffffu, b, off);
  if (lane == 0) (in ? bcat[o] : bz[o - ncat]) = weight_at(bias, 0, src.row) + b;
}

// A block of 256 threads sums 256 / lanes columns over all parts: lane l of a column takes
// parts l, l + lanes, ... in order, then the lanes' sums combine in a fixed tree. Deterministic.
// lanes grows with the number of parts (the column-sum partials have thousands of parts and
// few columns: 8 lanes per column left each thread ~600 dependent additions, ~70 us per call).
constexpr int kSumThreads = 256;
__global__ void __launch_bounds__(kSumThreads)
    sum_partials_kernel(const float* part, int64_t count, int64_t parts, float* out, int lanes, bool add) {
  __shared__ float red[kSumThreads];  // [lane][column]
  const int cols = kSumThreads / lanes, col = threadIdx.x % cols, lane = threadIdx.x / cols;
  const int64_t e = int64_t(blockIdx.x) * cols + col;
  float s = 0.f;
  if (e < count) {
#pragma unroll 8
    for (int64_t i = lane; i < parts; i += lanes) s += part[i * count + e];
  }
  red[threadIdx.x] = s;
  for (int h = lanes / 2; h > 0; h /= 2) {
    __syncthreads();
    if (lane < h) red[lane * cols + col] += red[(lane + h) * cols + col];
  }
  if (lane == 0 && e < count) out[e] = add ? out[e] + red[col] : red[col];
}

// dW[row][c] = G[o][c] gamma[c] + S[o] beta[c] and dbias[row] = S[o], for every weight row:
// one block per row o, threads over c (one thread per row, walking its columns, took ~90 us).
__global__ void __launch_bounds__(kThreads)
    finalize_rows_kernel(WeightSet ws, WeightSet dws, Dims d, const float* g_in, const float* g_in_lo,
                         const float* s_in, const float* g_out, const float* s_out) {
  const int o = blockIdx.x;
  const int ncat = static_cast<int>(d.proj_cols());
  const bool in = o < ncat;
  const Source src = in ? wcat_source(o, static_cast<int>(d.Ch)) : Source{kPOutW, o - ncat};
  const int K = static_cast<int>(in ? d.C : d.Ch);
  // G[o][c]: G_in is stored transposed ([C][P], columns in dlin's order; an a/b row adds its
  // column of G_in_lo [C][4Ch]), G_out row-major ([C][Ch])
  const int64_t col = in ? dlin_col(o, d.Ch) : 0;
  const float* G = in ? g_in + col : g_out + int64_t(o - ncat) * K;
  const float* G_lo = in && o < 4 * d.Ch ? g_in_lo + col : nullptr;
  const int64_t gc = in ? ncat : 1, gc_lo = 4 * d.Ch;
  const float S = in ? s_in[col] : s_out[o - ncat];
  const WeightRef &gamma = ws.w[in ? kNormInW : kNormOutW], &beta = ws.w[in ? kNormInB : kNormOutB];
  const WeightRef &dW = dws.w[src.weight], &db = dws.w[src.weight + 1];
  if (dW.ptr)
    for (int c = threadIdx.x; c < K; c += kThreads)
      store_any(dW, src.row * dW.s0 + c,
                (G[c * gc] + (G_lo ? G_lo[c * gc_lo] : 0.f)) * weight_at(gamma, 0, c) + S * weight_at(beta, 0, c));
  if (db.ptr && threadIdx.x == 0) store_any(db, src.row, S);
}

// d gamma[c] = sum_o W[o][c] G[o][c], d beta[c] = sum_o W[o][c] S[o] over every row o that
// reads the normalised input (both LayerNorms). One block per channel: each thread sums a
// strided subset of rows, then a fixed-shape tree combines them (deterministic).
// Where the LayerNorm backward ran in its product's epilogue, its direct totals
// (norm_in / norm_out: [d gamma | d beta], 2W floats) are used instead.
__global__ void finalize_norm_kernel(WeightSet ws, WeightSet dws, Dims d, const float* g_in,
                                     const float* g_in_lo, const float* s_in, const float* g_out,
                                     const float* s_out, const float* norm_in, const float* norm_out) {
  __shared__ float red[2][kThreads];
  const int t = blockIdx.x;
  const bool in = t < d.C;
  const int c = in ? t : t - static_cast<int>(d.C);
  const WeightRef &dgamma = dws.w[in ? kNormInW : kNormOutW], &dbe = dws.w[in ? kNormInB : kNormOutB];
  if (const float* direct = in ? norm_in : norm_out) {
    const int W = static_cast<int>(in ? d.C : d.Ch);
    if (threadIdx.x == 0 && dgamma.ptr) store_any(dgamma, c, direct[c]);
    if (threadIdx.x == 0 && dbe.ptr) store_any(dbe, c, direct[W + c]);
    return;
  }
  const int K = static_cast<int>(in ? d.C : d.Ch);
  const int rows = static_cast<int>(in ? d.proj_cols() : d.C);
  float dg = 0.f, dbeta = 0.f;
  for (int o = threadIdx.x; o < rows; o += kThreads) {
    const Source src = in ? wcat_source(o, static_cast<int>(d.Ch)) : Source{kPOutW, o};
    const float w = weight_at(ws.w[src.weight], src.row, c);
    const int64_t col = in ? dlin_col(o, d.Ch) : o;
    const float g = in ? g_in[int64_t(c) * rows + col] + (o < 4 * d.Ch ? g_in_lo[c * 4 * d.Ch + col] : 0.f)
                       : g_out[int64_t(o) * K + c];  // G_in, G_in_lo transposed
    dg += w * g;
    dbeta += w * (in ? s_in : s_out)[col];
  }
  red[0][threadIdx.x] = dg;
  red[1][threadIdx.x] = dbeta;
  for (int h = kThreads / 2; h > 0; h /= 2) {
    __syncthreads();
    if (threadIdx.x < h) {
      red[0][threadIdx.x] += red[0][threadIdx.x + h];
      red[1][threadIdx.x] += red[1][threadIdx.x + h];
    }
  }
  if (threadIdx.x != 0) return;
  if (dgamma.ptr) store_any(dgamma, c, red[0][0]);
  if (dbe.ptr) store_any(dbe, c, red[1][0]);
}

}  // namespace

cudaError_t prep_weights(const Problem& p, void* wcat, float* bcat, void* wz, float* bz,
                         void* wcat_raw, void* wz_raw, cudaStream_t s) {
  const int64_t rows = p.d.proj_cols() + p.d.C;
  prep_kernel<<<static_cast<unsigned>((rows + kPrepRowsPerBlock - 1) / kPrepRowsPerBlock), kThreads, 0, s>>>(
      p.w, p.d, static_cast<__half*>(wcat), bcat, static_cast<__half*>(wz), bz,
      static_cast<__nv_bfloat16*>(wcat_raw), static_cast<__nv_bfloat16*>(wz_raw));
  return cudaGetLastError();
}

cudaError_t sum_partials(const float* part, int64_t count, int64_t parts, float* out,
                         cudaStream_t s, bool add) {
  int lanes = 8;  // each thread sums at most ~32 parts where it can
  while (lanes < kSumThreads / 2 && parts > 32 * lanes) lanes *= 2;
  const int64_t cols = kSumThreads / lanes;
  sum_partials_kernel<<<static_cast<unsigned>((count + cols - 1) / cols), kSumThreads, 0, s>>>(part, count, parts,
                                                                                             out, lanes, add);
  return cudaGetLastError();
}

cudaError_t finalize_weight_grads(const Problem& p, const float* g_in, const float* g_in_lo, const float* s_in,
                                  const float* g_out, const float* s_out, const float* norm_in,
                                  const float* norm_out, cudaStream_t s) {
  finalize_rows_kernel<<<static_cast<unsigned>(p.d.proj_cols() + p.d.C), kThreads, 0, s>>>(p.w, p.dw, p.d, g_in,
                                                                                          g_in_lo, s_in, g_out, s_out);
  finalize_norm_kernel<<<static_cast<unsigned>(p.d.C + p.d.Ch), kThreads, 0, s>>>(p.w, p.dw, p.d, g_in, g_in_lo,
                                                                                 s_in, g_out, s_out, norm_in, norm_out);
  return cudaGetLastError();
}

}  // namespace tpf::trimul
