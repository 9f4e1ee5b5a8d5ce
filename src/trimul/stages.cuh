// GEMM stages shared by the forward and backward sequences: the input projection and the
// triangle product (forward direction), each for either 16-bit operand type.
#pragma once
#include "trimul/epilogues.cuh"
#include "trimul/kernels.h"
#include "trimul/workspace.h"

namespace tpf::trimul {

// Operands over the buffers (pixel-major [M][W] or one channel-major matrix per channel).
inline Operand pixel_rows(const void* ptr, const Dims& d, int64_t width) {
  return {ptr, width, 0, d.M(), width};
}
inline Operand channel_matrices(const void* ptr, const Dims& d) {
  return {ptr, d.Np, d.plane(), d.N, d.Np};
}
inline Operand weight_rows(const void* ptr, int64_t rows, int64_t cols) {
  return {ptr, cols, 0, rows, cols};
}

// zhat [M][C] x wcat -> a, b (channel-major) and the output gate.
template <class T>
cudaError_t project(const Problem& p, const Workspace& ws, cudaStream_t s) {
  const Dims& d = p.d;
  ProjectEpilogue<T> epi{d, ws.bcat, p.mask, static_cast<T*>(ws.a), static_cast<T*>(ws.b),
                         static_cast<T*>(ws.gate)};
  return launch_gemm<T, Major::kK, Major::kK>(pixel_rows(ws.xhat_in, d, d.C),
                                              weight_rows(ws.wcat, d.proj_cols(), d.C),
                                              {d.M(), static_cast<int>(d.proj_cols()), d.C, 0}, 1,
                                              epi, s);
}

// x_c = A_c B_cᵀ (outgoing) or A_cᵀ B_c (incoming) for every (batch, channel); x bf16 with
// zero pads (the pad columns of B are zero).
template <class T>
cudaError_t triangle_product(const Problem& p, const Workspace& ws, cudaStream_t s) {
  const Dims& d = p.d;
  const StoreEpilogue<__nv_bfloat16> epi{static_cast<__nv_bfloat16*>(ws.x), d.Np, d.plane(), d.N, d.Np};
  const GemmShape shape{d.N, static_cast<int>(d.Np), d.N, 0};
  const int batches = static_cast<int>(d.B * d.Ch);
  const Operand A = channel_matrices(ws.a, d), B = channel_matrices(ws.b, d);
  return p.outgoing ? launch_gemm<T, Major::kK, Major::kK>(A, B, shape, batches, epi, s)
                    : launch_gemm<T, Major::kMN, Major::kMN>(A, B, shape, batches, epi, s);
}

// LayerNorm_in, projections, triangle product and LayerNorm_out: everything up to xhat_out.
template <class T>
cudaError_t forward_through_product(const Problem& p, const Workspace& ws, Operand16 t,
                                    float* mean_in, float* rstd_in, float* mean_out,
                                    float* rstd_out, cudaStream_t s) {
  cudaError_t e;
  if ((e = prep_weights(p, t, ws.wcat, ws.bcat, ws.wz, ws.bz, s)) != cudaSuccess) return e;
  if ((e = ln_rows_forward(p, t, ws.xhat_in, mean_in, rstd_in, s)) != cudaSuccess) return e;
  if ((e = project<T>(p, ws, s)) != cudaSuccess) return e;
  if ((e = triangle_product<T>(p, ws, s)) != cudaSuccess) return e;
  return ln_channel_major_forward(p, t, ws.x, ws.xhat_out, mean_out, rstd_out, s);
}

}  // namespace tpf::trimul
