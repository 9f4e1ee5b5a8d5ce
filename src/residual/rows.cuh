// Device helpers of the residual update's rows, shared by its kernels (residual.cu) and the
// epilogues that fuse the update (the multiplicative update's output stage): 8 consecutive
// channels of one (b, i, j) row at a time, in 16-byte loads and stores.
#pragma once
#include "common/dtype_pairs.cuh"
#include "common/mma.cuh"
#include "residual/kernels.h"

namespace tpf::residual {

constexpr int kVec = 8;  // channels per access

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
