// Host launchers of the multiplicative-update kernels (row kernels, weight preparation and
// weight-gradient reduction) and the two stage sequences. All return the launch error.
#pragma once
#include <cuda_runtime.h>

#include "trimul/layout.h"

namespace tpf::trimul {

// Weights in TrimulWeights order.
enum WeightIndex {
  kNormInW = 0, kNormInB, kPInW, kPInB, kGInW, kGInB, kNormOutW, kNormOutB, kPOutW, kPOutB,
  kGOutW, kGOutB, kNumWeights
};
struct WeightSet {
  WeightRef w[kNumWeights];
};

// The 16-bit operand type of a stage sequence: the forward uses fp16 (its operands, LayerNorm
// outputs, sigmoid gates and gated projections, are bounded and gain 3 mantissa bits), the
// backward bf16 (gradients span bf16's range).
enum class Operand16 { kFP16, kBF16 };

struct Problem {
  Dims d;
  PairRef z, out, dout, dz;
  MaskRef mask;
  WeightSet w, dw;  // dw: gradient outputs (ptr nullptr where not requested)
  bool outgoing;
  float eps;
};

// Folds LayerNorm_in's gamma into the concatenated input weight [4Ch + C][C] (row order in
// epilogues.cuh) and beta into its bias; likewise LayerNorm_out into Wz [C][Ch].
cudaError_t prep_weights(const Problem& p, Operand16 t, void* wcat, float* bcat, void* wz,
                         float* bz, cudaStream_t s);
// LayerNorm statistics and the normalised rows (no affine: it is folded into the weights).
cudaError_t ln_rows_forward(const Problem& p, Operand16 t, void* xhat, float* mean, float* rstd,
                            cudaStream_t s);
cudaError_t ln_channel_major_forward(const Problem& p, Operand16 t, const void* x, void* xhat,
                                     float* mean, float* rstd, cudaStream_t s);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = d xhat (bf16 [M][W]).
cudaError_t ln_rows_backward(const Problem& p, const void* dxhat, const float* mean,
                             const float* rstd, cudaStream_t s);
cudaError_t ln_channel_major_backward(const Problem& p, const void* dxhat, const void* x,
                                      const float* mean, const float* rstd, void* dx,
                                      cudaStream_t s);
// out[e] = sum over parts of part[i * count + e], in part order.
cudaError_t sum_partials(const float* part, int64_t count, int64_t parts, float* out,
                         cudaStream_t s);
// Weight, bias and LayerNorm gradients from G_in = dlinᵀ zhat, S_in = colsum(dlin),
// G_out = dyᵀ xhat_out, S_out = colsum(dy).
cudaError_t finalize_weight_grads(const Problem& p, const float* g_in, const float* s_in,
                                  const float* g_out, const float* s_out, cudaStream_t s);

}  // namespace tpf::trimul

namespace tpf::trimul {
struct Workspace;
// The stage sequences (forward.cu, backward.cu).
cudaError_t run_forward(const Problem& p, const Workspace& ws, cudaStream_t s);
cudaError_t run_backward(const Problem& p, const Workspace& ws, cudaStream_t s);
}  // namespace tpf::trimul
