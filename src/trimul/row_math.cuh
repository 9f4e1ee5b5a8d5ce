// Per-pixel LayerNorm pieces shared by the row kernels (row_kernels.cu) and the GEMM epilogue
// that fuses the LayerNorm backward (norm_epilogue.cuh).
//
// A row of W channels (W a multiple of 32) is held by a group of 8 lanes: lane l8 holds the
// 4-channel units u < W / 32 at channels 4 (l8 + 8u) .. + 3, as v[4u + e]. Rows of one warp
// are four groups; the shuffles below stay inside a group.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mma.cuh"

namespace tpf::trimul::rows {

constexpr int kGroupLanes = 8;

__device__ __forceinline__ int unit_channel(int l8, int u) { return 4 * (l8 + kGroupLanes * u); }

__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = 1; o < kGroupLanes; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// d x of the normalisation from g = d xhat and xhat (same layout), in place in g:
// rstd (g - mean(g) - xhat mean(g xhat)). Every lane of the warp must call it.
template <int kVals>
__device__ __forceinline__ void norm_backward(float (&g)[kVals], const float (&xh)[kVals], int W, float rstd) {
  const int units = W / 32;
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int i = 0; i < kVals; ++i)
    if (i / 4 < units) sg += g[i], sgx += g[i] * xh[i];
  const float mg = group_sum(sg) / W, mgx = group_sum(sgx) / W;
#pragma unroll
  for (int i = 0; i < kVals; ++i) g[i] = rstd * (g[i] - mg - xh[i] * mgx);
}

__device__ __forceinline__ bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// Four consecutive channels of a 16-bit row as floats (one 8-byte load when aligned).
template <class T>
__device__ __forceinline__ void load4(float* v, const T* src, bool vec) {
  if (vec) {
    const uint2 u = *reinterpret_cast<const uint2*>(src);
    const float2 lo = dev::pair_to_float2<T>(u.x), hi = dev::pair_to_float2<T>(u.y);
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = dev::to_float(src[e]);
  }
}
__device__ __forceinline__ void load4(float* v, const float* src, bool) {  // 16-byte aligned rows
  const float4 q = *reinterpret_cast<const float4*>(src);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
template <class T>
__device__ __forceinline__ void store4(T* dst, const float* v, bool vec) {
  if (vec) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(dev::MmaOp<T>::pack(v[0], v[1]), dev::MmaOp<T>::pack(v[2], v[3]));
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = dev::from_float<T>(v[e]);
  }
}

}  // namespace tpf::trimul::rows
