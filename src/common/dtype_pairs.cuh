// The (storage, compute) dtype pairs the element-wise kernels around the GEMMs are built for:
// an fp32 tensor with an fp32, bf16 or fp16 partner (mixed precision: the fp32 residual stream and
// the autocast dtype), or both in one 16-bit dtype. validate.h's detail::mixed_pair() is the
// host-side check of the same set.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "turbopairformer/tensor.h"

namespace tpf::dev {

// f(A{}, B{}) with the C++ types of dtypes (a, b); cudaErrorInvalidValue for a pair outside the set.
template <class F>
cudaError_t with_mixed_pair(DType a, DType b, F&& f) {
  if (a == DType::kFP32 && b == DType::kFP32) return f(float{}, float{});
  if (a == DType::kFP32 && b == DType::kBF16) return f(float{}, __nv_bfloat16{});
  if (a == DType::kFP32 && b == DType::kFP16) return f(float{}, __half{});
  if (a == DType::kBF16 && b == DType::kBF16) return f(__nv_bfloat16{}, __nv_bfloat16{});
  if (a == DType::kFP16 && b == DType::kFP16) return f(__half{}, __half{});
  return cudaErrorInvalidValue;  // validation refuses other pairs first
}

}  // namespace tpf::dev
