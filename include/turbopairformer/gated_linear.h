// The gated output projection of the attention layers (AF3 Algorithm 14's last two lines), with
// the residual update of the block around it, fused into one pass. Rows r = (b I + i) J + j of
// a [B, I, J, .] pair tensor, K = 128 gate channels (heads x head dim), N = 128 output channels:
//
//   h = sigmoid(g) o,  y = h W^T + bias,  out = x + scale y (x given) or out = y
//
// with W = linear_o.weight [N, K] and the roundings of the unfused bf16 path (h and y each
// rounded to bf16). h is never written. The backward is the unfused one: the sigmoid gate's
// (turbopairformer/gate.h) and the residual's (turbopairformer/residual.h) around two GEMMs; one
// fused kernel for it measured slower (docs/perf-notes.md).
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

// for_gpu = false: the CPU reference's rules, which also take FP64 for every tensor.
Status validate_gated_linear(const GatedLinearParams& p, bool for_gpu);
// CUDA entry point (sm_90: wgmma; nothing allocated). Where the device is not sm_90, it returns
// kUnsupported.
Status gated_linear_forward(const GatedLinearParams& p, cudaStream_t stream);

}  // namespace tpf
