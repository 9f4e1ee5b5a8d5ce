// The SwiGLU activation of the transitions (AF3 Algorithm 11), on the output of one stacked
// up projection x = [a | b] (the two halves of the last dimension):
//
//   y = silu(a) * b,   silu(a) = a * sigmoid(a)
//
// One pass each way: the forward reads x and writes y; the backward reads x and dy and writes
// dx = [da | db] in the layout of x (so the stacked projection's backward takes it as one
// operand) and, where asked, y again (bitwise the forward's), so that a training forward need
// not keep y for the down projection's weight gradient.
//
// On the GPU the projections on either side may run with it, the activation then applied to
// the GEMM's accumulators (one pass over x each way, none over dy):
//   forward with u, w_up     x = u w_upᵀ is written (rounded to x's dtype), then y from it
//   backward with g, w_down  dy = g w_down (fp32, never stored) takes the place of dy
// w_up's rows are a's and b's in alternating 64-row blocks (a's rows 0-63, b's rows 0-63, a's
// rows 64-127, ...), so that one output tile holds both halves of its channels; x stays
// [a | b]. bf16 or fp16, H a multiple of 64, C a multiple of 8.
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct SwigluParams {
  TensorView x;   // [..., 2H] contiguous; bf16, fp16 or fp32
  TensorView y;   // [..., H] contiguous, x's dtype; forward: written; backward: optional, written
  TensorView dy;  // backward: [..., H] contiguous, x's dtype
  TensorView dx;  // backward: x's shape and dtype, contiguous, written
  TensorView u;       // forward, optional: [..., C] with x's leading dims, contiguous, x's dtype
  TensorView w_up;    // with u: [2H, C] contiguous, x's dtype, rows blocked as above
  TensorView g;       // backward, optional (then dy absent): [..., C] like u
  TensorView w_down;  // with g: [C, H] contiguous, x's dtype
};

Status validate_swiglu(const SwigluParams& p, bool backward, bool for_gpu);
// CUDA entry points (H a multiple of 8; nothing allocated).
Status swiglu_forward(const SwigluParams& p, cudaStream_t stream);
Status swiglu_backward(const SwigluParams& p, cudaStream_t stream);

}  // namespace tpf
