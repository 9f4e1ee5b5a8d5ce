// The SwiGLU activation of the transitions (AF3 Algorithm 11), on the output of one stacked
// up projection x = [a | b] (the two halves of the last dimension):
//
//   y = silu(a) * b,   silu(a) = a * sigmoid(a)
//
// One pass each way: the forward reads x and writes y; the backward reads x and dy and writes
// dx = [da | db] in the layout of x (so the stacked projection's backward takes it as one
// operand) and, where asked, y again (bitwise the forward's), so that a training forward need
// not keep y for the down projection's weight gradient.
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
};

Status validate_swiglu(const SwigluParams& p, bool backward, bool for_gpu);
// CUDA entry points (H a multiple of 8; nothing allocated).
Status swiglu_forward(const SwigluParams& p, cudaStream_t stream);
Status swiglu_backward(const SwigluParams& p, cudaStream_t stream);

}  // namespace tpf
