#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "testing/device_random.h"

namespace tpf::harness {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float uniform01(uint64_t bits) {  // (0, 1]
  return (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);
}

template <class T>
__global__ void normal_kernel(T* out, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = mix(seed ^ mix(static_cast<uint64_t>(i)));
    const float u1 = uniform01(r), u2 = uniform01(mix(r));
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);  // Box-Muller
    if constexpr (sizeof(T) == 4) out[i] = z;
    else out[i] = static_cast<T>(z);
  }
}

__global__ void mask_kernel(uint8_t* out, int64_t count, float keep, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = uniform01(mix(seed ^ mix(static_cast<uint64_t>(i)))) <= keep;
}

}  // namespace

cudaError_t fill_normal_device(void* data, DType dtype, int64_t count, uint64_t seed,
                               cudaStream_t stream) {
  const unsigned blocks = 1024;
  switch (dtype) {
    case DType::kBF16: normal_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, seed); break;
    case DType::kFP16: normal_kernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(data), count, seed); break;
    case DType::kFP32: normal_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(data), count, seed); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t fill_mask_device(uint8_t* data, int64_t count, double keep, uint64_t seed,
                             cudaStream_t stream) {
  mask_kernel<<<1024, 256, 0, stream>>>(data, count, static_cast<float>(keep), seed);
  return cudaGetLastError();
}

}  // namespace tpf::harness
