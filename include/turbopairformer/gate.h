// The sigmoid gate of the attention layers (AF3 Algorithm 14, "sigmoid(g) * o" before the
// output projection), on rows of the gate g and of the attention output o:
//
//   y = sigmoid(g) * o
//
// One pass each way: the forward reads g and o and writes y; the backward reads g, o and dy and
// writes dg, do and, where asked, y again (bitwise the forward's), so that a training forward
// need not keep y for the output projection's weight gradient. Every tensor is [R, W] with a
// free row stride, so g can be a column block of a stacked projection's output and dg can be
// written straight into that projection's gradient.
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct SigmoidGateParams {
  TensorView g;   // [R, W] bf16, fp16 or fp32 (GPU); any float dtype (reference); last stride 1
  TensorView o;   // [R, W] g's dtype
  TensorView y;   // [R, W] g's dtype; forward: written; backward: optional, written
  TensorView dy;  // backward: [R, W] g's dtype
  TensorView dg;  // backward: [R, W] g's dtype, written
  TensorView d_o; // backward: [R, W] g's dtype, written
  // The backward's optional by-product for the attention backward (its Dlt, so that pass need
  // not read do and o again): delta [B, I, J, H] fp32, any strides, with B I J = R (row r =
  // (b I + i) J + j) and W = H D: delta[b, i, j, h] = sum over head h's D columns of
  // do (o + out_residual), do as written. On the GPU: 16-bit g, D / 8 a power of two up to 32,
  // and the sum in the attention backward's own order, so it is that pass's value bit for bit.
  TensorView out_residual;  // backward: optional [R, W] g's dtype, with delta only
  TensorView delta;         // backward: optional, written
};

Status validate_sigmoid_gate(const SigmoidGateParams& p, bool backward, bool for_gpu);
// CUDA entry points (W a multiple of 8, 16-byte aligned rows; nothing allocated).
Status sigmoid_gate_forward(const SigmoidGateParams& p, cudaStream_t stream);
Status sigmoid_gate_backward(const SigmoidGateParams& p, cudaStream_t stream);

}  // namespace tpf
