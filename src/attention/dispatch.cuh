// Picks the kernel instantiation for the shipped combinations: activation dtype (bf16, fp16) x
// bias dtype (the activation dtype, fp32) x head dim (16, 32, 64, 128). Op<T, BiasT, D>::run
// does the launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tpf::attn {

template <template <class, class, int> class Op, class T, class BiasT, class... Args>
cudaError_t dispatch_head_dim(int head_dim, Args&&... args) {
  switch (head_dim) {
    case 16: return Op<T, BiasT, 16>::run(args...);
    case 32: return Op<T, BiasT, 32>::run(args...);
    case 64: return Op<T, BiasT, 64>::run(args...);
    case 128: return Op<T, BiasT, 128>::run(args...);
  }
  return cudaErrorInvalidValue;
}

template <template <class, class, int> class Op, class... Args>
cudaError_t dispatch(bool fp16, bool bias_fp32, int head_dim, Args&&... args) {
  if (fp16)
    return bias_fp32 ? dispatch_head_dim<Op, __half, float>(head_dim, args...)
                     : dispatch_head_dim<Op, __half, __half>(head_dim, args...);
  return bias_fp32 ? dispatch_head_dim<Op, __nv_bfloat16, float>(head_dim, args...)
                   : dispatch_head_dim<Op, __nv_bfloat16, __nv_bfloat16>(head_dim, args...);
}

}  // namespace tpf::attn
