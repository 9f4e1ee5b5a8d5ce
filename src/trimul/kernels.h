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

// Precision plan. Products whose operands are bounded (LayerNorm outputs without affine, the
// gamma-folded weights) run in fp16, which has 3 more mantissa bits than bf16: the input
// projections and the output projection, forward and backward. Forward a and b (gated, masked
// projections) are fp16 too; x, whose range grows with N, is bf16. Every product with a gradient
// operand runs in bf16 (gradients span bf16's range), against unfolded weights (exact for bf16
// weights) with gamma applied in fp32 in the epilogue. The backward keeps the gate logit in fp16
// (s(1 - s) from a rounded s would lose its low bits near s = 1) and da, db in fp32 (they feed an
// epilogue, not a tensor-core operand), as are d xhat_in and d xhat_out: the LayerNorm
// backward reads them unrounded (a bf16 d xhat cost ~0.4x the floor on dz); dy is stored as a
// bf16 high/low pair, so its two products (d xhat_out and dWz) see it to ~16 bits, and so is
// xhat_in as the input-side weight-gradient operand (N = 384's d Wg_in was 2.15x the floor), and
// dlin's a/b columns for the d xhat_in product and dW_in (their bf16 rounding held dz at 2.0x
// the floor and dW_in at ~2.0x with weights at an initialisation scale; the CPU emulation
// predicts 1.76x for both).

struct Problem {
  Dims d;
  PairRef z, out, dout, dz;
  PairRef dz_in;  // added to dz (ptr nullptr: nothing); dz's dtype
  ResidualRef res;  // the forward's residual update around the op: out is its rows
  bool dz_f32;    // dz (and dz_in) fp32, else bf16
  MaskRef mask;
  WeightSet w, dw;  // dw: gradient outputs (ptr nullptr where not requested)
  bool outgoing;
  float eps;
};

// Folds LayerNorm_in's gamma into the concatenated input weight [4Ch + C][C] (row order in
// dlin_order.h) and beta into its bias; likewise LayerNorm_out into Wz [C][Ch].
// wcat, wz fp16 (folded); wcat_raw, wz_raw (optional) bf16 copies of the unfolded weights, each
// with the rows that meet a low part again after it (wcat_raw: the 4Ch a/b rows, [4Ch + C + 4Ch][C];
// wz_raw: all of Wz, [2C][Ch]); wcat_raw's rows in dlin's column order (dlin_order.h).
cudaError_t prep_weights(const Problem& p, void* wcat, float* bcat, void* wz, float* bz,
                         void* wcat_raw, void* wz_raw, cudaStream_t s);
// LayerNorm statistics and the normalised rows (no affine: it is folded into the weights), in
// fp16 and optionally also bf16 (xhat_bf: the weight-gradient operand; for the rows, z's
// LayerNorm, as a high/low pair [M][2C]); mean/rstd optional. Pixels [r0, r1) (r1 < 0: M), their
// rows in xhat and xhat_bf from row 0 (mean and rstd stay indexed by pixel).
cudaError_t ln_rows_forward(const Problem& p, void* xhat, void* xhat_bf, float* mean,
                            float* rstd, cudaStream_t s, int64_t r0 = 0, int64_t r1 = -1);
cudaError_t ln_channel_major_forward(const Problem& p, const void* x, void* xhat, void* xhat_bf,
                                     float* mean, float* rstd, cudaStream_t s);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = d xhat (bf16 [M][W]).
cudaError_t ln_rows_backward(const Problem& p, const float* dxhat, const float* mean,
                             const float* rstd, cudaStream_t s);
cudaError_t ln_channel_major_backward(const Problem& p, const float* dxhat, const void* x,
                                      const float* mean, const float* rstd, void* dx,
                                      cudaStream_t s);
// out[e] = sum over parts of part[i * count + e] in a fixed order (add: out[e] += that sum, a
// running total over calls in call order).
cudaError_t sum_partials(const float* part, int64_t count, int64_t parts, float* out,
                         cudaStream_t s, bool add = false);
// Weight, bias and LayerNorm gradients from G_inᵀ = zhatᵀ dlin ([C][P], dlin's column order:
// dlin_order.h) plus G_in_loᵀ = zhatᵀ (dlin's a/b low parts) ([C][4Ch]), S_in =
// colsum(dlin), G_out = dyᵀ xhat_out ([C][Ch]), S_out = colsum(dy).
// norm_in / norm_out (nullable): the LayerNorms' [d gamma | d beta] summed directly (2W floats),
// which replace the ones derived from G and S.
cudaError_t finalize_weight_grads(const Problem& p, const float* g_in, const float* g_in_lo, const float* s_in,
                                  const float* g_out, const float* s_out, const float* norm_in,
                                  const float* norm_out, cudaStream_t s);

}  // namespace tpf::trimul

namespace tpf::trimul {
struct Workspace;
// The stage sequences (forward.cu, backward.cu).
cudaError_t run_forward(const Problem& p, const Workspace& ws, cudaStream_t s);
// recompute: the workspace holds no saved set from the forward; the backward builds it.
cudaError_t run_backward(const Problem& p, const Workspace& ws, bool recompute, cudaStream_t s);
}  // namespace tpf::trimul
