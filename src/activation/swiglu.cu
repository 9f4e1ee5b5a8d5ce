// SwiGLU forward and backward: element-wise over 16-byte vectors of a and of b (the two halves
// of each row of x); bandwidth-bound, one read of every input and one write of every output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "activation/swiglu_kernels.h"
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

// 1 / (1 + e^-a) in fp32: exact in both tails to fp32's relative precision (a saturated gate
// keeps its digits), where 0.5 tanh(a / 2) + 0.5 would not.
__device__ __forceinline__ float sigmoid(float a) { return 1.f / (1.f + __expf(-a)); }

// Vector i of the flattened [rows][H / kN]: its element offset in x's row (a at `xa`, b at
// xa + H) and in y's.
struct At {
  int64_t xa, y;
  __device__ At(int64_t i, int64_t vecs_per_row, int64_t H, int kN) {
    const int64_t m = i / vecs_per_row, j = (i % vecs_per_row) * kN;
    xa = m * 2 * H + j, y = m * H + j;
  }
};

template <class T>
__global__ void __launch_bounds__(kThreads) forward_kernel(Shape s, const T* x, T* y) {
  constexpr int kN = Vec<T>::kN;
  const int64_t per_row = s.H / kN, n = s.rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const At at(i, per_row, s.H, kN);
    const Vec<T> a = load(x + at.xa), b = load(x + at.xa + s.H);
    Vec<T> h;
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float av = dev::to_float(a.v[e]);
      h.v[e] = dev::from_float<T>(av * sigmoid(av) * dev::to_float(b.v[e]));
    }
    store(y + at.y, h);
  }
}

// da = dy b sigmoid(a) (1 + a (1 - sigmoid(a))), db = dy silu(a); y (optional) as the forward.
template <class T>
__global__ void __launch_bounds__(kThreads) backward_kernel(Shape s, const T* x, const T* dy, T* dx, T* y) {
  constexpr int kN = Vec<T>::kN;
  const int64_t per_row = s.H / kN, n = s.rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const At at(i, per_row, s.H, kN);
    const Vec<T> a = load(x + at.xa), b = load(x + at.xa + s.H), g = load(dy + at.y);
    Vec<T> da, db, h;
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float av = dev::to_float(a.v[e]), bv = dev::to_float(b.v[e]), gv = dev::to_float(g.v[e]);
      const float sg = sigmoid(av), silu = av * sg;
      da.v[e] = dev::from_float<T>(gv * bv * sg * (1.f + av * (1.f - sg)));
      db.v[e] = dev::from_float<T>(gv * silu);
      h.v[e] = dev::from_float<T>(silu * bv);
    }
    store(dx + at.xa, da);
    store(dx + at.xa + s.H, db);
    if (y) store(y + at.y, h);
  }
}

unsigned blocks(const Shape& s, int kN) {
  const int64_t n = s.rows * (s.H / kN), b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 132 * 16 ? b : 132 * 16);  // a grid-stride loop past 16 per SM
}

template <class F>
cudaError_t with_type(DType d, F&& f) {
  switch (d) {
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kFP16: return f(__half{});
    case DType::kFP32: return f(float{});
    default: return cudaErrorInvalidValue;  // validation refuses other dtypes first
  }
}

}  // namespace

cudaError_t forward(const Shape& s, DType dtype, const void* x, void* y, cudaStream_t st) {
  if (s.rows == 0) return cudaSuccess;
  return with_type(dtype, [&](auto t) {
    using T = decltype(t);
    forward_kernel<T><<<blocks(s, Vec<T>::kN), kThreads, 0, st>>>(s, static_cast<const T*>(x), static_cast<T*>(y));
    return cudaGetLastError();
  });
}

cudaError_t backward(const Shape& s, DType dtype, const void* x, const void* dy, void* dx, void* y,
                     cudaStream_t st) {
  if (s.rows == 0) return cudaSuccess;
  return with_type(dtype, [&](auto t) {
    using T = decltype(t);
    backward_kernel<T><<<blocks(s, Vec<T>::kN), kThreads, 0, st>>>(
        s, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<T*>(y));
    return cudaGetLastError();
  });
}

}  // namespace tpf::act
