// The gated output projection of the attention layers (AF3 Algorithm 14's last two lines), with
// the residual update of the block around it, fused into one pass each way. Rows r = (b I +
// i) J + j of a [B, I, J, .] pair tensor, K = 128 gate channels (heads x head dim), N = 128
// output channels:
//
//   forward:   h = sigmoid(g) o,  y = h W^T + bias,  out = x + scale y (x given) or out = y
//   backward:  du = dz scale,  dh = du W,  dg = dh o s (1 - s),  d_o = dh s,  h = s o
//
// with s = sigmoid(g), W = linear_o.weight [N, K], and the roundings of the unfused bf16 path
// (h, y, du and dh each rounded to bf16). The forward never writes h; the backward writes it
// with du, so that the weight gradients du^T h and colsum(du) need nothing kept.
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct GatedLinearParams {
  TensorView g;      // [R, K = 128] bf16, unit last stride, 16-byte rows (any row stride)
  TensorView o;      // [R, K] bf16, unit last stride, 16-byte rows
  TensorView w;      // [N = 128, K] bf16 contiguous
  TensorView bias;   // [N] bf16, optional (absent: 0)
  TensorView x;      // optional, the residual: [B, I, J, N] (B I J = R) contiguous, fp32 or bf16
  TensorView scale;  // optional, with x only: [B, I, J, N] bf16, any strides (0 to broadcast) whose
                     // last is 0 or 1 and the others multiples of 8
  TensorView out;    // [B, I, J, N] contiguous, written: x's dtype, or bf16 without x
};

struct GatedLinearBackwardParams {
  TensorView dz;     // [B, I, J, N] contiguous, fp32 or bf16: the gradient of out
  TensorView scale;  // optional, as the forward's
  TensorView g;      // [R, K] as the forward's
  TensorView o;      // [R, K] as the forward's
  TensorView w;      // [N, K] as the forward's
  TensorView du;     // [B, I, J, N] bf16 contiguous, written: dz scale
  TensorView dg;     // [R, K] bf16, unit last stride, 16-byte rows, written (may be a column block)
  TensorView d_o;    // [R, K] bf16 contiguous, written
  TensorView h;      // [R, K] bf16 contiguous, written: sigmoid(g) o
};

// for_gpu = false: the CPU reference's rules, which also take FP64 for every tensor.
Status validate_gated_linear(const GatedLinearParams& p, bool for_gpu);
Status validate_gated_linear_backward(const GatedLinearBackwardParams& p, bool for_gpu);
// CUDA entry points (sm_90: wgmma; nothing allocated). Where the device is not sm_90, they
// return kUnsupported.
Status gated_linear_forward(const GatedLinearParams& p, cudaStream_t stream);
Status gated_linear_backward(const GatedLinearBackwardParams& p, cudaStream_t stream);

}  // namespace tpf
