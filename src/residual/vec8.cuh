// Eight consecutive channels of a row at a time: the residual update's loads and stores, and
// the scale read through its strides (broadcast dims stride 0) as 8 values where its channel
// stride is 1 and as one where it is 0. Shared by the residual kernels (residual.cu) and the
// fused gated output projection's row passes (gated_linear/).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/mma.cuh"
#include "residual/kernels.h"

namespace tpf::residual {

constexpr int kVec = 8;  // channels per thread and step

template <class T>
__device__ __forceinline__ void load8(float* v, const T* p) {
  constexpr int kWords = kVec * sizeof(T) / 16;  // 16-byte loads: 1 (16-bit T) or 2 (fp32)
  uint4 w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = reinterpret_cast<const uint4*>(p)[i];
  const T* t = reinterpret_cast<const T*>(w);
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = dev::to_float(t[e]);
}

template <class T>
__device__ __forceinline__ void store8(T* p, const float* v) {
  constexpr int kWords = kVec * sizeof(T) / 16;
  uint4 w[kWords];
  T* t = reinterpret_cast<T*>(w);
#pragma unroll
  for (int e = 0; e < kVec; ++e) t[e] = dev::from_float<T>(v[e]);
#pragma unroll
  for (int i = 0; i < kWords; ++i) reinterpret_cast<uint4*>(p)[i] = w[i];
}

// The 8 scale values of the channels [c, c + 8) of row r = (b i + i) J + j; 1 where absent.
template <class Ts>
__device__ __forceinline__ void load_scale(float* v, const Shape& sh, Scale s, int64_t r, int64_t c) {
  if (!s.p) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = 1.f;
    return;
  }
  const int64_t j = r % sh.J, i = (r / sh.J) % sh.I, b = r / (sh.J * sh.I);
  const Ts* p = static_cast<const Ts*>(s.p) + b * s.s[0] + i * s.s[1] + j * s.s[2] + c * s.s[3];
  if (s.s[3] == 1) return load8(v, p);
  const float x = dev::to_float(*p);
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = x;
}

}  // namespace tpf::residual
