// Host launcher of the fused gated output projection of the attention layers (AF3 Algorithm
// 14's last two lines), on rows r = (b I + i) J + j:
//
//   y = sigmoid(g) o W^T + bias,   out = x + scale y (residual)   or   out = y
//
// with K = 128 (heads x head dim), N = 128 (output channels), and the 16-bit roundings of the
// unfused path (sigmoid(g) o and y rounded to bf16). The gated activation never leaves the
// chip. Returns the launch error.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "residual/kernels.h"
#include "turbopairformer/tensor.h"

namespace tpf::gated {

constexpr int kK = 128;  // gate and attention width: heads x head dim
constexpr int kN = 128;  // output channels

// Rows r = (b I + i) J + j of the pair shape {B, I, J, C = kN}; the scale as the residual
// update's (bf16, through its strides, the last 0 or 1; p null: 1).
using residual::Scale;
using residual::Shape;
__host__ __device__ inline int64_t row_count(const Shape& s) { return s.B * s.I * s.J; }

struct FwdArgs {
  Shape shape;
  const __nv_bfloat16* g;     // [rows][K] at row stride ld_g
  int64_t ld_g;
  const __nv_bfloat16* o;     // [rows][K] at row stride ld_o
  int64_t ld_o;
  const __nv_bfloat16* w;     // [N][K]
  const __nv_bfloat16* bias;  // [N] or null
  const void* x;              // [rows][N] in out_dtype, or null (no residual)
  Scale scale;                // residual only
  void* out;                  // [rows][N]: out_dtype, fp32 or bf16 (bf16 without residual)
  DType out_dtype;
};

cudaError_t forward(const FwdArgs& a, cudaStream_t stream);

}  // namespace tpf::gated
