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
__host__ __device__ Ptr<T> typed(Rows r) {
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

// Head dot: this lane's share of dots.p[row r, head of column j], sum of db (b + res) over the
// head's D columns. Each lane adds its kN products by fmaf in column order, then the head's D / kN
// lanes (consecutive, a power of two) add by an xor shuffle tree: the order of the attention
// backward's Dlt (reduce.cu's delta_kernel), so the two agree bit for bit. The head's first lane
// stores. `live`: the warp's lanes in this loop round (every head's lanes are in it or out).
template <class T>
__device__ __forceinline__ void head_dot(const HeadDots& dots, const Ptr<T>& res, int64_t r, int64_t j,
                                         const Vec<T>& dbv, const Vec<T>& bv, unsigned live) {
  constexpr int kN = Vec<T>::kN;
  Vec<T> rv;  // b's residual, zeros without one
  *reinterpret_cast<uint4*>(rv.v) = make_uint4(0, 0, 0, 0);
  if (res.p) rv = load(res.at(r, j));
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < kN; ++e) acc = fmaf(dev::to_float(dbv.v[e]), dev::to_float(bv.v[e]) + dev::to_float(rv.v[e]), acc);
  const int lanes = static_cast<int>(dots.D / kN);
  for (int o = 1; o < lanes; o <<= 1) acc += __shfl_xor_sync(live, acc, o);
  if ((j / kN) % lanes != 0) return;
  const int64_t b = r / (dots.I * dots.J), i = (r / dots.J) % dots.I, jj = r % dots.J, h = j / dots.D;
  dots.p[b * dots.stride[0] + i * dots.stride[1] + jj * dots.stride[2] + h * dots.stride[3]] = acc;
}

template <class T, Gate G>
__global__ void __launch_bounds__(kThreads) backward_kernel(int64_t rows, int64_t W, Ptr<T> a, Ptr<T> b, Ptr<T> dy,
                                                            Ptr<T> da, Ptr<T> db, Ptr<T> y, HeadDots dots) {
  constexpr int kN = Vec<T>::kN;
  const int64_t per_row = W / kN, n = rows * per_row;
  const Ptr<T> res = typed<T>(dots.res);
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
    if (dots.p) {
      const int64_t first = i - threadIdx.x % 32;  // the warp's lane 0; lanes past n have left
      const unsigned live = n - first >= 32 ? 0xffffffffu : (1u << (n - first)) - 1u;
      head_dot(dots, res, r, j, dbv, bv, live);
    }
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

cudaError_t backward(const Shape& s, Rows a, Rows b, Rows dy, Rows da, Rows db, Rows y, const HeadDots& dots,
                     cudaStream_t st) {
  if (s.rows == 0 || s.W == 0) return cudaSuccess;
  return dispatch(s, [&](auto t, auto g) {
    using T = decltype(t);
    backward_kernel<T, decltype(g)::value><<<blocks(s, Vec<T>::kN), kThreads, 0, st>>>(
        s.rows, s.W, typed<T>(a), typed<T>(b), typed<T>(dy), typed<T>(da), typed<T>(db), typed<T>(y), dots);
    return cudaGetLastError();
  });
}

}  // namespace tpf::act
