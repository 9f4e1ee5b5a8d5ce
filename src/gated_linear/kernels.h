// Host launchers of the fused gated output projection of the attention layers (AF3 Algorithm
// 14's last two lines), on rows r = (b I + i) J + j:
//
//   forward:   y = sigmoid(g) o W^T + bias,   out = x + scale y (residual)   or   out = y
//   backward:  du = dz scale,  dh = du W,  dg = dh o s (1 - s),  d_o = dh s,  h = s o
//
// with s = sigmoid(g), h = s o the gated activation, K = 128 (heads x head dim) and N = 128
// (output channels), and the 16-bit roundings of the unfused path (h, y, du and dh rounded to
// bf16). The gated activation never leaves the chip in the forward; the backward writes it
// back with du for the weight gradient du^T h. Returns the launch error.
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

struct BwdArgs {
  Shape shape;
  const void* dz;             // [rows][N] in dz_dtype (fp32 or bf16): the gradient of out
  DType dz_dtype;
  Scale scale;
  const __nv_bfloat16* g;     // [rows][K] at ld_g
  int64_t ld_g;
  const __nv_bfloat16* o;     // [rows][K] at ld_o
  int64_t ld_o;
  const __nv_bfloat16* w;     // [N][K]
  __nv_bfloat16* du;          // [rows][N], written: dz scale
  __nv_bfloat16* dg;          // [rows][K] at ld_dg, written
  int64_t ld_dg;
  __nv_bfloat16* d_o;         // [rows][K], written
  __nv_bfloat16* h;           // [rows][K], written: sigmoid(g) o
};

cudaError_t backward(const BwdArgs& a, cudaStream_t stream);

}  // namespace tpf::gated
