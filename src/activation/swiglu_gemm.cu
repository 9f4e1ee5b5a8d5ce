// The transition's projections around SwiGLU on the GEMM engine's wgmma main loop
// (trimul/gemm_wgmma.cuh), the activation applied to the accumulators in registers, so that
// neither the up projection's output nor the down projection's input gradient makes a pass of
// its own through memory:
//
//   forward    x = u w_upᵀ (stored in x's dtype), y = silu(a) b from the stored a, b
//   backward   dy = g w_down (fp32, never stored), then dx = [da | db] and y as the row kernels
//
// Accumulator layout (gemm_wgmma.cuh): thread (g = lane / 4, t = lane % 4) of the warp whose
// 16 rows start at row0 holds acc[4i + 2h + e] at (row0 + g + 8h, column 8i + 2t + e), i < 16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "activation/gate_math.cuh"
#include "common/mma.cuh"
#include "trimul/gemm_wgmma.cuh"

namespace tpf::act {
namespace {

using trimul::Cfg;
using Silu = Act<Gate::kSilu>;

template <class T>
__device__ __forceinline__ void store_pair(T* p, float v0, float v1) {
  *reinterpret_cast<uint32_t*>(p) = dev::MmaOp<T>::pack(v0, v1);
}

// The forward's tile: w_up's rows come in 64-row blocks alternating a and b, so the tile's
// columns [0, 64) are a's channels j0 + [0, 64) and [64, 128) the same channels of b: the
// thread holding a_j (acc[4i + ..], i < 8) holds b_j too (acc[4(i + 8) + ..]).
template <class T>
struct ProjectSwigluEpilogue {
  T* x;  // [M, 2H] = [a | b], written
  T* y;  // [M, H], written
  int64_t M, H;

  __device__ void wgmma_fragments(const float (&acc)[64], int row0, int64_t m0, int n0, int) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t j = n0 / 2 + 8 * i + 2 * t;  // a's and b's channel pair j, j + 1
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + row0 + g + 8 * h;
        if (m >= M) continue;
        float a[2], b[2], f[2];  // [e]: channels j + e, as stored (rounded to T)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          a[e] = dev::to_float(dev::from_float<T>(acc[4 * i + 2 * h + e]));
          b[e] = dev::to_float(dev::from_float<T>(acc[4 * (i + 8) + 2 * h + e]));
          f[e] = Silu::value(a[e], sigmoid(a[e])) * b[e];
        }
        store_pair(x + m * 2 * H + j, a[0], a[1]);
        store_pair(x + m * 2 * H + H + j, b[0], b[1]);
        store_pair(y + m * H + j, f[0], f[1]);
      }
    }
  }
};

// The backward's tile: dy for channels n0 + [0, 128) of 128 rows; each thread reads its a, b
// pairs from x and writes da, db and y for them.
template <class T>
struct ProjectSwigluBackwardEpilogue {
  const T* x;  // [M, 2H], the forward's
  T* dx;       // [M, 2H], written
  T* y;        // [M, H], written where given
  int64_t M, H;

  __device__ void wgmma_fragments(const float (&acc)[64], int row0, int64_t m0, int n0, int) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < Cfg::kBlockN / 8; ++i) {
      const int64_t j = n0 + 8 * i + 2 * t;
      if (j >= H) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + row0 + g + 8 * h;
        if (m >= M) continue;
        const float2 a = dev::pair_to_float2<T>(*reinterpret_cast<const uint32_t*>(x + m * 2 * H + j));
        const float2 b = dev::pair_to_float2<T>(*reinterpret_cast<const uint32_t*>(x + m * 2 * H + H + j));
        const float av[2] = {a.x, a.y}, bv[2] = {b.x, b.y};
        float da[2], db[2], f[2];  // [e]: channels j + e
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float dy = acc[4 * i + 2 * h + e], s = sigmoid(av[e]), fa = Silu::value(av[e], s);
          da[e] = dy * bv[e] * Silu::slope(av[e], s);
          db[e] = dy * fa;
          f[e] = fa * bv[e];
        }
        store_pair(dx + m * 2 * H + j, da[0], da[1]);
        store_pair(dx + m * 2 * H + H + j, db[0], db[1]);
        if (y) store_pair(y + m * H + j, f[0], f[1]);
      }
    }
  }
};

template <class F>
cudaError_t with_type(DType d, F&& f) {
  switch (d) {
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kFP16: return f(__half{});
    default: return cudaErrorInvalidValue;  // validation refuses other dtypes first
  }
}

}  // namespace

cudaError_t project_forward(const ProjectShape& s, const void* u, const void* w_up, void* x, void* y,
                            cudaStream_t st) {
  if (s.M == 0) return cudaSuccess;
  return with_type(s.dtype, [&](auto t) {
    using T = decltype(t);
    const trimul::Operand A{u, s.C, 0, s.M, s.C};              // [M, C], K-major
    const trimul::Operand B{w_up, s.C, 0, 2 * s.H, s.C};       // [2H, C], K-major
    const trimul::GemmShape shape{s.M, static_cast<int>(2 * s.H), s.C, 0};
    const ProjectSwigluEpilogue<T> epi{static_cast<T*>(x), static_cast<T*>(y), s.M, s.H};
    return trimul::launch_gemm_wgmma<T, trimul::Major::kK, trimul::Major::kK>(A, B, shape, 1, epi, st);
  });
}

cudaError_t project_backward(const ProjectShape& s, const void* g, const void* w_down, const void* x, void* dx,
                             void* y, cudaStream_t st) {
  if (s.M == 0) return cudaSuccess;
  return with_type(s.dtype, [&](auto t) {
    using T = decltype(t);
    const trimul::Operand A{g, s.C, 0, s.M, s.C};            // [M, C], K-major
    const trimul::Operand B{w_down, s.H, 0, s.C, s.H};       // [C, H]: dy's column n at k·H + n, MN-major
    const trimul::GemmShape shape{s.M, static_cast<int>(s.H), s.C, 0};
    const ProjectSwigluBackwardEpilogue<T> epi{static_cast<const T*>(x), static_cast<T*>(dx), static_cast<T*>(y),
                                               s.M, s.H};
    return trimul::launch_gemm_wgmma<T, trimul::Major::kK, trimul::Major::kMN>(A, B, shape, 1, epi, st);
  });
}

}  // namespace tpf::act
