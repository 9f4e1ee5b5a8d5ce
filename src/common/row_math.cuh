// Per-row LayerNorm pieces shared by the multiplicative update's row kernels
// (trimul/row_kernels.cu), its GEMM epilogue that fuses the LayerNorm backward
// (trimul/norm_epilogue.cuh), and the stand-alone LayerNorm (norm/layer_norm.cu).
//
// A row of W channels is held by a group of L lanes (8 by default, W a multiple of 32; 16 for
// W a multiple of 64, halving each lane's registers): lane l holds the 4-channel units
// u < W / (4 L) at channels 4 (l + L u) .. + 3, as v[4u + e]. Rows of one warp are 32 / L
// groups; the shuffles below stay inside a group.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mma.cuh"

namespace tpf::rows {

constexpr int kGroupLanes = 8;

template <int L = kGroupLanes>
__device__ __forceinline__ int unit_channel(int l, int u) { return 4 * (l + L * u); }

template <int L = kGroupLanes>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = 1; o < L; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Mean and 1/sqrt(var + eps) of a row of W channels held by a group (v[4u + e], u < W / 4L);
// two passes over the registers (no E[x^2] - mean^2 cancellation).
template <int L = kGroupLanes, int kVals>
__device__ __forceinline__ float2 row_stats(const float (&v)[kVals], int W, float eps) {
  const int units = W / (4 * L);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kVals; ++i) s += i / 4 < units ? v[i] : 0.f;
  const float mean = group_sum<L>(s) / W;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < kVals; ++i) q += i / 4 < units ? (v[i] - mean) * (v[i] - mean) : 0.f;
  return make_float2(mean, rsqrtf(group_sum<L>(q) / W + eps));
}

// d x of the normalisation from g = d xhat and xhat (same layout), in place in g:
// rstd (g - mean(g) - xhat mean(g xhat)). Every lane of the warp must call it.
template <int L = kGroupLanes, int kVals>
__device__ __forceinline__ void norm_backward(float (&g)[kVals], const float (&xh)[kVals], int W, float rstd) {
  const int units = W / (4 * L);
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int i = 0; i < kVals; ++i)
    if (i / 4 < units) sg += g[i], sgx += g[i] * xh[i];
  const float mg = group_sum<L>(sg) / W, mgx = group_sum<L>(sgx) / W;
#pragma unroll
  for (int i = 0; i < kVals; ++i) g[i] = rstd * (g[i] - mg - xh[i] * mgx);
}

__device__ __forceinline__ bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }
// Whether four consecutive elements from p move as one vector access (8 bytes of a 16-bit type,
// 16 of fp32).
template <class T>
__device__ __forceinline__ bool aligned4(const T* p) { return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0; }

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
// fp32 rows: one 16-byte access when aligned.
__device__ __forceinline__ void load4(float* v, const float* src, bool vec) {
  if (vec) {
    const float4 q = *reinterpret_cast<const float4*>(src);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = src[e];
  }
}
__device__ __forceinline__ void store4(float* dst, const float* v, bool vec) {
  if (vec) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = v[e];
  }
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

}  // namespace tpf::rows
