// GEMM stages shared by the forward and backward sequences: the input projection and the
// triangle product (forward direction), each for either 16-bit operand type.
#pragma once
#include <type_traits>

#include "trimul/epilogues.cuh"
#include "trimul/gemm_tma.cuh"
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

// The triangle product's operands: fp16 in the forward, bf16 in the backward's recompute.
template <class TAB>
TAB* operand(const Workspace& ws, bool second) {
  if constexpr (std::is_same_v<TAB, __half>) return static_cast<TAB*>(second ? ws.b : ws.a);
  else return static_cast<TAB*>(second ? ws.b_bf : ws.a_bf);
}

// zhat [M][C] x wcat (fp16) -> a, b (channel-major, TAB), the output gate (forward) and what
// the backward keeps: the gate logit and bf16 copies of a, b (where the workspace has them).
// Where N % 8 == 0 it runs on the TMA loop, elsewhere on the wgmma one.
template <class TAB>
cudaError_t project(const Problem& p, const Workspace& ws, cudaStream_t s) {
  const Dims& d = p.d;
  constexpr bool kForward = std::is_same_v<TAB, __half>;
  auto* a_bf = static_cast<__nv_bfloat16*>(kForward ? ws.a_bf : nullptr);
  auto* b_bf = static_cast<__nv_bfloat16*>(kForward ? ws.b_bf : nullptr);
  auto* gate = static_cast<__half*>(kForward ? ws.gate : nullptr);
  auto* logit = static_cast<__half*>(ws.logit);
  const Operand xhat = pixel_rows(ws.xhat_in, d, d.C), w = weight_rows(ws.wcat, d.proj_cols(), d.C);
  const GemmShape shape{d.M(), static_cast<int>(d.proj_cols()), d.C, 0};
  const ProjectOutputs<TAB> out{d, ws.bcat, p.mask, operand<TAB>(ws, false), operand<TAB>(ws, true), a_bf, b_bf,
                                gate, logit};
  TmaOperands maps{};
  if (d.N % 8 == 0 && encode_tma_operands<__half, Major::kK, Major::kK>(
                          &maps, xhat, w, kTmaBlockM<ProjectTmaEpilogue<TAB>>, ProjectTile::kBlockN, 1))
    return launch_tma_loop<__half, Major::kK, Major::kK>(maps, shape, 1, ProjectTmaEpilogue<TAB>{out}, s);
  return launch_gemm_wgmma<__half, Major::kK, Major::kK>(xhat, w, shape, 1, ProjectEpilogue<TAB>{out}, s);
}

// A long-K product (4 or more k-steps: the weight gradients, K = B N^2; the d xhat products,
// K = 2C and 4Ch + C; the triangle products where the TMA loop cannot take them, K = N): on
// wgmma or mma.sync (kLongKWgmma).
// The short ones (K = C or Ch, two k-steps) whose epilogues prefetch an operand stay on
// mma.sync; the input projection (project above) runs on the TMA loop or wgmma.
template <class T, Major AM, Major BMJ, class Epi>
cudaError_t launch_long_k(const Operand& A, const Operand& B, const GemmShape& shape, int batches,
                          const Epi& epi, cudaStream_t s) {
  if constexpr (kLongKWgmma) return launch_gemm_wgmma<T, AM, BMJ>(A, B, shape, batches, epi, s);
  else return launch_gemm<T, AM, BMJ>(A, B, shape, batches, epi, s);
}

// x_c = A_c B_cᵀ (outgoing) or A_cᵀ B_c (incoming) for every (batch, channel); x bf16 with
// zero pads (the pad columns of B are zero).
template <class T>
cudaError_t triangle_product(const Problem& p, const Workspace& ws, cudaStream_t s) {
  const Dims& d = p.d;
  const StoreEpilogue<__nv_bfloat16> epi{static_cast<__nv_bfloat16*>(ws.x), d.Np, d.plane(), d.N, d.Np};
  const GemmShape shape{d.N, static_cast<int>(d.Np), d.N, 0};
  const int batches = static_cast<int>(d.B * d.Ch);
  const Operand A = channel_matrices(operand<T>(ws, false), d), B = channel_matrices(operand<T>(ws, true), d);
  return p.outgoing ? launch_product<T, Major::kK, Major::kK>(A, B, shape, batches, epi, s)
                    : launch_product<T, Major::kMN, Major::kMN>(A, B, shape, batches, epi, s);
}

// Folded weights, LayerNorm_in, projections, triangle product and LayerNorm_out: everything up
// to xhat_out. Statistics, bf16 copies and raw weights are written where the workspace has them
// (a saving forward, the backward's recompute).
template <class TAB>
cudaError_t forward_through_product(const Problem& p, const Workspace& ws, cudaStream_t s) {
  cudaError_t e;
  if ((e = prep_weights(p, ws.wcat, ws.bcat, ws.wz, ws.bz, ws.wcat_raw, ws.wz_raw, s)) != cudaSuccess) return e;
  // (the bf16 pair only where something reads it: the recomputing backward's overlays remake it
  // per tail chunk)
  void* xhat_bf = ws.xhat_per_chunk ? nullptr : ws.xhat_in_bf;
  if ((e = ln_rows_forward(p, ws.xhat_in, xhat_bf, ws.mean_in, ws.rstd_in, s)) != cudaSuccess) return e;
  if ((e = project<TAB>(p, ws, s)) != cudaSuccess) return e;
  if ((e = triangle_product<TAB>(p, ws, s)) != cudaSuccess) return e;
  return ln_channel_major_forward(p, ws.x, ws.xhat_out, ws.xhat_out_bf, ws.mean_out, ws.rstd_out, s);
}

}  // namespace tpf::trimul
