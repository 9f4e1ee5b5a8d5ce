// The SwiGLU transition of the Pairformer (OpenFold3's SwiGLUTransition, AF3 Algorithm 11) as
// one fused forward pass over rows of C = 128 channels:
//
//   xhat = LayerNorm(x) (weight, bias),  [a | b] = xhat W_ab^T,  h = silu(a) * b,  y = h W_o^T
//   out  = x + scale * y   (residual = true)    or    out = y
//
// with W_ab = [linear_a.weight; linear_b.weight] ([2H, C]) and W_o = linear_out.weight
// ([C, H]) in bf16, and the roundings of the unfused bf16 path (xhat, a, b, h and y each rounded
// to bf16). The [rows, 2H] hidden activation stays on chip; what a training forward keeps for
// the backward is xhat (bf16) and the LayerNorm's statistics.
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct TransitionParams {
  TensorView x;      // [..., C = 128] contiguous; fp32 or bf16
  TensorView ln_w;   // [C] fp32, optional (absent: 1)
  TensorView ln_b;   // [C] fp32, optional (absent: 0)
  float eps = 1e-5f;
  TensorView w_ab;   // [2H, C] bf16 contiguous, H a multiple of 64
  TensorView w_o;    // [C, H] bf16 contiguous
  TensorView scale;  // residual only: [...] (x's leading dims, one value a row) fp32 contiguous, optional (1)
  bool residual = false;
  TensorView out;    // x's shape, contiguous, written: x's dtype (residual) or bf16
  TensorView xhat;   // optional: x's shape, bf16 contiguous, written
  TensorView mean;   // optional: [...] fp32 contiguous, written
  TensorView rstd;   // optional: [...] fp32 contiguous, written (1 / sqrt(var + eps))
};

// The backward's middle, from xhat (the forward's) and g = d y (the gradient of the down
// projection's output, the residual's scale applied): [a | b] = xhat W_ab^T and dh = g W_o are
// recomputed on chip, and written are
//   h = silu(a) b,  [da | db] = SwiGLU's backward of dh,  dxhat = [da | db] W_ab
// (each rounded to bf16 as the unfused path's kernels store them). The weight gradients are
// then g^T h and [da | db]^T xhat, the LayerNorm's backward takes dxhat.
struct TransitionBackwardParams {
  TensorView xhat;   // [..., C = 128] bf16 contiguous
  TensorView g;      // xhat's shape, bf16 contiguous
  TensorView w_ab;   // [2H, C] bf16 contiguous, H a multiple of 64
  TensorView w_o;    // [C, H] bf16 contiguous
  TensorView h;      // [..., H] bf16 contiguous, written
  TensorView dab;    // [..., 2H] bf16 contiguous, written
  TensorView dxhat;  // xhat's shape, bf16 contiguous, written
};

Status validate_transition(const TransitionParams& p, bool for_gpu);
// for_gpu = false: the CPU reference's rules, which also take FP64 for every tensor.
Status validate_transition_backward(const TransitionBackwardParams& p, bool for_gpu);
// CUDA entry point (sm_90: wgmma and TMA; nothing allocated). Where the device is not sm_90,
// returns kUnsupported.
Status transition_forward(const TransitionParams& p, cudaStream_t stream);
Status transition_backward(const TransitionBackwardParams& p, cudaStream_t stream);

}  // namespace tpf
