// Triangle multiplicative update (docs/DESIGN.md section 2, AlphaFold3 Algorithms 12 and 13).
//
//   zn = LayerNorm_in(z)                                   z: [B,N,N,C]
//   a  = sigmoid(zn Wag^T + bag) * (zn Wap^T + bap) * mask  [B,N,N,Ch]   (b likewise)
//   x[i,j,c] = sum_k a[i,k,c] b[j,k,c]   (outgoing)   or   sum_k a[k,i,c] b[k,j,c]   (incoming)
//   out = sigmoid(zn Wg^T + bg) * (LayerNorm_out(x) Wz^T + bz)   [B,N,N,C]
//
// Weights follow cuEquivariance: p_in_weight = [Wap; Wbp] (2Ch x C), g_in_weight = [Wag; Wbg],
// p_out_weight = Wz (C x Ch), g_out_weight = Wg (C x C); biases optional.
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

enum class TrimulDirection : int { kOutgoing = 0, kIncoming = 1 };

// The learnable tensors. Used both for values and for their gradients.
struct TrimulWeights {
  TensorView norm_in_weight, norm_in_bias;    // [C]
  TensorView p_in_weight;                     // [2Ch, C]
  TensorView p_in_bias;                       // [2Ch], optional
  TensorView g_in_weight;                     // [2Ch, C]
  TensorView g_in_bias;                       // [2Ch], optional
  TensorView norm_out_weight, norm_out_bias;  // [Ch]
  TensorView p_out_weight;                    // [C, Ch]
  TensorView p_out_bias;                      // [C], optional
  TensorView g_out_weight;                    // [C, C]
  TensorView g_out_bias;                      // [C], optional
};

struct TrimulForwardParams {
  TensorView z;     // [B,N,N,C]
  TensorView mask;  // [B,N,N] any float dtype or bool, optional
  TrimulWeights w;
  TrimulDirection direction = TrimulDirection::kOutgoing;
  double eps = 1e-5;
  TensorView out;   // [B,N,N,C] z's dtype (residual's with a residual), written
  // Optional residual update around the op: out = residual + scale * update, the update rounded
  // to z's dtype first (where the unfused path rounds it), so that the update is never written.
  // residual: [B,N,N,C] contiguous, fp32 or z's dtype (e.g. the fp32 stream z was rounded
  // from); scale: optional, with residual only, [B,N,N,C] bf16 through any strides whose last is
  // 0 or 1 (a dropout mask shared along rows). The backward ignores both: its dout is the
  // update's gradient (the residual's, times scale), as without them.
  TensorView residual, scale;
  // Optional device buffer of trimul_saved_size bytes (256-byte aligned) for training: the
  // forward writes into it what the backward needs (normalised inputs, projections, the
  // triangle product, statistics), and a backward given the same buffer, the same inputs and
  // weights, reads it instead of recomputing the forward (its gradients are then those of the
  // forward's own fp16 products). nullptr: the forward keeps nothing and the backward recomputes.
  // The backward only reads it, so it may serve several backward calls.
  void* saved = nullptr;
  size_t saved_bytes = 0;
};

struct TrimulBackwardParams {
  TrimulForwardParams fwd;  // inputs as in the forward (fwd.out is ignored)
  TensorView dout;          // [B,N,N,C] z's dtype: the update's gradient
  TensorView dz;            // [B,N,N,C] z's dtype or fp32, written
  TensorView dz_in;         // dz's shape and dtype, optional: added to dz (it may be dz itself),
                            //   so that the gradient of a residual around the update joins dz
                            //   in the same pass (an fp32 dz then holds the sum unrounded)
  TrimulWeights dw;         // each written where the matching weight is present
};

Status validate_trimul_forward(const TrimulForwardParams& p, bool for_gpu);
Status validate_trimul_backward(const TrimulBackwardParams& p, bool for_gpu);

// CUDA entry points (bf16 z; weights bf16 or fp32). Both need a device workspace of the size the
// matching query returns (256-byte aligned); nothing is allocated inside a call. Forward:
// fp16 tensor-core operands (LayerNorm outputs and gated projections are bounded, so fp16's
// extra mantissa bits halve the error of the bf16 path); the gated projections a, b must stay
// below 65504 in magnitude. Backward: bf16 operands. Both are bitwise deterministic.
Status trimul_forward_workspace_size(const TrimulForwardParams& p, size_t* bytes);
Status trimul_backward_workspace_size(const TrimulBackwardParams& p, size_t* bytes);
// Bytes of the `saved` buffer: of the problem's shapes, or of B, N, C, Ch (0 if one is < 1).
Status trimul_saved_size(const TrimulForwardParams& p, size_t* bytes);
size_t trimul_saved_bytes(int64_t B, int64_t N, int64_t C, int64_t Ch);
Status trimul_forward(const TrimulForwardParams& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);
Status trimul_backward(const TrimulBackwardParams& p, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream);

}  // namespace tpf
