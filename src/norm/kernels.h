// Host launchers of the stand-alone LayerNorm kernels (layer_norm.cu). Each returns the launch
// error. Rows are contiguous [rows][W], W a multiple of 32 and <= 256.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "turbopairformer/tensor.h"

namespace tpf::norm {

struct Param {  // weight or bias: nullptr = absent (1 or 0)
  const void* ptr;
  DType dtype;
};

struct Grad {  // dweight or dbias: nullptr = not requested
  void* ptr;
  DType dtype;
};

struct Rows {
  int64_t rows;
  int W;
  float eps;
};

// Bytes of the backward's per-block partial sums of (dy xhat, dy) ([blocks][2W] fp32).
size_t backward_partials_bytes(const Rows& r);

cudaError_t forward(const Rows& r, const void* x, DType x_dtype, Param weight, Param bias, void* y,
                    DType y_dtype, float* mean, float* rstd, cudaStream_t s);
// dx (+ dx_in where set), and dweight / dbias where requested (through `partials`,
// backward_partials_bytes).
cudaError_t backward(const Rows& r, const void* x, DType x_dtype, const void* dy, DType dy_dtype,
                     Param weight, const float* mean, const float* rstd, void* dx, const void* dx_in, Grad dweight,
                     Grad dbias, float* partials, cudaStream_t s);

}  // namespace tpf::norm
