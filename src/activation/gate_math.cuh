// The gated activations' scalar math, shared by the stand-alone kernels (activation/gated.cu)
// and the fused transition (transition/forward.cu), so that every path rounds the same bits.
#pragma once
#include "activation/kernels.h"

namespace tpf::act {

// 1 / (1 + e^-a) in fp32: exact in both tails to fp32's relative precision (a saturated gate
// keeps its digits) down to e^a ~ 2^-126, where 0.5 tanh(a / 2) + 0.5 would not. The approximate
// reciprocal has no slow-path branch: in the fused transition's unrolled loops the IEEE
// division's branch kept every element's exponential and reciprocal in one serial chain
// (docs/perf-notes.md, the fused SwiGLU transition).
__device__ __forceinline__ float sigmoid(float a) { return __fdividef(1.f, 1.f + __expf(-a)); }

// f(a) and f'(a) from a and s = sigmoid(a). The forward and the backward's recomputed y both
// call value(), so the two round identically.
template <Gate G>
struct Act;
template <>
struct Act<Gate::kSilu> {
  static __device__ __forceinline__ float value(float a, float s) { return a * s; }
  static __device__ __forceinline__ float slope(float a, float s) { return s * (1.f + a * (1.f - s)); }
};
template <>
struct Act<Gate::kSigmoid> {
  static __device__ __forceinline__ float value(float, float s) { return s; }
  static __device__ __forceinline__ float slope(float, float s) { return s * (1.f - s); }
};

}  // namespace tpf::act
