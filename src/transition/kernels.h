// Host launchers of the fused SwiGLU transition kernels. The forward (transition/forward.cu):
//
//   xhat = LayerNorm(x),  [a | b] = xhat W_ab^T,  h = silu(a) * b,  y = h W_o^T
//   out  = x + scale * y   (residual)   or   out = y
//
// over rows of C = 128 channels, H a multiple of 64, with the 16-bit operands and roundings of
// the unfused path (xhat, a, b, h and y rounded to bf16). The 4 C hidden activation never
// leaves the chip. Returns the launch error, or cudaErrorNotSupported where a tensor map cannot
// be built for the operands.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "turbopairformer/tensor.h"

namespace tpf::transition {

constexpr int kC = 128;     // channels of a row (c_z)
constexpr int kChunk = 64;  // hidden units of one step: W_ab's a and b rows, W_o's columns

struct FwdArgs {
  int64_t rows;
  int H;                         // hidden width, a multiple of kChunk
  const void* x;                 // [rows][C], x_dtype (fp32 or bf16), 16-byte aligned
  DType x_dtype;
  const float* ln_w;             // [C]
  const float* ln_b;             // [C]
  float eps;
  const __nv_bfloat16* w_ab;     // [2H][C]: linear_a's rows, then linear_b's
  const __nv_bfloat16* w_o;      // [C][H]
  const float* scale;            // [rows] or null (1): the residual's per-row scale
  bool residual;
  void* out;                     // [rows][C]: x_dtype (residual) or bf16
  __nv_bfloat16* xhat;           // [rows][C] or null
  float* mean;                   // [rows] or null
  float* rstd;                   // [rows] or null
};

cudaError_t forward(const FwdArgs& a, cudaStream_t stream);

// The backward's middle (transition/backward.cu): from xhat and g = d y, with [a | b] and dh =
// g W_o recomputed on chip, h = silu(a) b and [da | db] (SwiGLU's backward) for the weight
// gradients and dxhat = [da | db] W_ab for the LayerNorm's backward; all bf16, contiguous rows.
struct BwdArgs {
  int64_t rows;
  int H;
  const __nv_bfloat16* xhat;  // [rows][C]
  const __nv_bfloat16* g;     // [rows][C]
  const __nv_bfloat16* w_ab;  // [2H][C]
  const __nv_bfloat16* w_o;   // [C][H]
  __nv_bfloat16* h;           // [rows][H], written
  __nv_bfloat16* dab;         // [rows][2H], written
  __nv_bfloat16* dxhat;       // [rows][C], written
};

cudaError_t backward(const BwdArgs& a, cudaStream_t stream);

}  // namespace tpf::transition
