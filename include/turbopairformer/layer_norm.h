// LayerNorm over the last dimension, as the Pairformer's projections and transitions use it:
//
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)   (biased variance)
//
// The CUDA path reads x in its own precision and writes y straight in the precision of the GEMM
// that consumes it (bf16 y from fp32 x under autocast: no separate cast pass), and its backward
// gives deterministic weight and bias gradients (per-block partials summed in a fixed order).
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct LayerNormForwardParams {
  TensorView x;               // [..., W] contiguous; fp32, bf16 or fp16
  TensorView weight, bias;    // [W], each optional (absent: 1 and 0); fp32, bf16 or fp16
  double eps = 1e-5;
  TensorView y;               // x's shape, contiguous, written; fp32, bf16 or fp16
  TensorView mean, rstd;      // [rows] fp32 (rows = numel / W), optional, written
};

struct LayerNormBackwardParams {
  LayerNormForwardParams fwd;  // x, weight, bias, eps as in the forward; mean and rstd required
  TensorView dy;               // y's shape and dtype, contiguous
  TensorView dx;               // x's shape and dtype, contiguous, written
  TensorView dweight, dbias;   // their parameter's shape and dtype, optional, written
  TensorView dx_in;            // x's shape and dtype, contiguous, optional: added to dx (it may be
                               //   dx itself), so that the gradient of a residual around the
                               //   layer joins dx in the same pass
};

Status validate_layer_norm_forward(const LayerNormForwardParams& p, bool for_gpu);
Status validate_layer_norm_backward(const LayerNormBackwardParams& p, bool for_gpu);

// CUDA entry points: W a multiple of 32 and at most 256; (x, y) dtypes (fp32, bf16), (fp32,
// fp16), (fp32, fp32), (bf16, bf16) or (fp16, fp16). The backward needs a device workspace of
// the size the query returns (256-byte aligned; 0 without dweight and dbias).
Status layer_norm_forward(const LayerNormForwardParams& p, cudaStream_t stream);
Status layer_norm_backward_workspace_size(const LayerNormBackwardParams& p, size_t* bytes);
Status layer_norm_backward(const LayerNormBackwardParams& p, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream);

}  // namespace tpf
