// Host launchers of the SwiGLU kernels (swiglu.cu); contiguous rows, H a multiple of 8,
// 16-byte aligned tensors. Each returns the launch error.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "turbopairformer/tensor.h"

namespace tpf::act {

struct Shape {
  int64_t rows, H;
};

cudaError_t forward(const Shape& s, DType dtype, const void* x, void* y, cudaStream_t st);
// y nullable: the forward's y, recomputed.
cudaError_t backward(const Shape& s, DType dtype, const void* x, const void* dy, void* dx, void* y,
                     cudaStream_t st);

}  // namespace tpf::act
