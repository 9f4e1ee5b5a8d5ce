// Gated activations, forward and backward: element-wise over 16-byte vectors of each row;
// bandwidth-bound, one read of every input and one write of every output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "activation/gate_math.cuh"
#include "activation/kernels.h"
#include "common/mma.cuh"

namespace tpf::act {
namespace {

constexpr int kThreads = 256;

template <class T>
struct Vec {  // 16 bytes of T
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <class T>
__device__ __forceinline__ Vec<T> load(const T* p) {
  Vec<T> r;
  *reinterpret_cast<uint4*>(r.v) = *reinterpret_cast<const uint4*>(p);
  return r;
}
template <class T>
__device__ __forceinline__ void store(T* p, const Vec<T>& r) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(r.v);
}

template <class T>
struct Ptr {  // a typed operand: row r, element j at p[r * stride + j]
  T* p;
  int64_t stride;
  __device__ T* at(int64_t r, int64_t j) const { return p + r * stride + j; }
};
template <class T>
Ptr<T> typed(Rows r) {
  return {static_cast<T*>(const_cast<void*>(r.p)), r.stride};
}

template <class T, Gate G>
__global__ void __launch_bounds__(kThreads) forward_kernel(int64_t rows, int64_t W, Ptr<T> a, Ptr<T> b, Ptr<T> y) {
  constexpr int kN = Vec<T>::kN;
  const int64_t per_row = W / kN, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / per_row, j = (i % per_row) * kN;
    const Vec<T> av = load(a.at(r, j)), bv = load(b.at(r, j));
    Vec<T> h;
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float x = dev::to_float(av.v[e]);
      h.v[e] = dev::from_float<T>(Act<G>::value(x, sigmoid(x)) * dev::to_float(bv.v[e]));
    }
    store(y.at(r, j), h);
  }
}

template <class T, Gate G>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(int64_t rows, int64_t W, Ptr<T> a, Ptr<T> b, Ptr<T> dy, Ptr<T> da, Ptr<T> db, Ptr<T> y) {
  constexpr int kN = Vec<T>::kN;
  const int64_t per_row = W / kN, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / per_row, j = (i % per_row) * kN;
    const Vec<T> av = load(a.at(r, j)), bv = load(b.at(r, j)), gv = load(dy.at(r, j));
    Vec<T> dav, dbv, h;
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float x = dev::to_float(av.v[e]), bx = dev::to_float(bv.v[e]), g = dev::to_float(gv.v[e]);
      const float s = sigmoid(x), f = Act<G>::value(x, s);
      dav.v[e] = dev::from_float<T>(g * bx * Act<G>::slope(x, s));
      dbv.v[e] = dev::from_float<T>(g * f);
      h.v[e] = dev::from_float<T>(f * bx);
    }
    store(da.at(r, j), dav);
    store(db.at(r, j), dbv);
    if (y.p) store(y.at(r, j), h);
  }
}

unsigned blocks(const Shape& s, int kN) {
  const int64_t n = s.rows * (s.W / kN), b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 132 * 16 ? b : 132 * 16);  // a grid-stride loop past 16 per SM
}

// f(T{}, gate constant) for the shape's dtype and gate.
template <class F>
cudaError_t dispatch(const Shape& s, F&& f) {
  auto with_gate = [&](auto t) {
    return s.gate == Gate::kSilu ? f(t, std::integral_constant<Gate, Gate::kSilu>{})
                                 : f(t, std::integral_constant<Gate, Gate::kSigmoid>{});
  };
  switch (s.dtype) {
    case DType::kBF16: return with_gate(__nv_bfloat16{});
    case DType::kFP16: return with_gate(__half{});
    case DType::kFP32: return with_gate(float{});
    default: return cudaErrorInvalidValue;  // validation refuses other dtypes first
  }
}

}  // namespace

cudaError_t forward(const Shape& s, Rows a, Rows b, Rows y, cudaStream_t st) {
  if (s.rows == 0 || s.W == 0) return cudaSuccess;
  return dispatch(s, [&](auto t, auto g) {
    using T = decltype(t);
    forward_kernel<T, decltype(g)::value>
        <<<blocks(s, Vec<T>::kN), kThreads, 0, st>>>(s.rows, s.W, typed<T>(a), typed<T>(b), typed<T>(y));
    return cudaGetLastError();
  });
}

cudaError_t backward(const Shape& s, Rows a, Rows b, Rows dy, Rows da, Rows db, Rows y, cudaStream_t st) {
  if (s.rows == 0 || s.W == 0) return cudaSuccess;
  return dispatch(s, [&](auto t, auto g) {
    using T = decltype(t);
    backward_kernel<T, decltype(g)::value><<<blocks(s, Vec<T>::kN), kThreads, 0, st>>>(
        s.rows, s.W, typed<T>(a), typed<T>(b), typed<T>(dy), typed<T>(da), typed<T>(db), typed<T>(y));
    return cudaGetLastError();
  });
}

}  // namespace tpf::act
