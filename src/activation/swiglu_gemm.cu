// The transition's projections around SwiGLU on the GEMM engine's wgmma main loop
// (trimul/gemm_wgmma.cuh), the activation applied to the accumulators in registers, so that
// neither the up projection's output nor the down projection's input gradient makes a pass of
// its own through memory:
//
//   forward    x = u w_upᵀ (stored in x's dtype), y = silu(a) b from the stored a, b
//   backward   dy = g w_down (fp32, never stored), then dx = [da | db] and y as the row kernels
//
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "activation/gate_math.cuh"
#include "common/mma.cuh"
#include "trimul/gemm_wgmma.cuh"

namespace tpf::act {
namespace {

using trimul::Cfg;
using Silu = Act<Gate::kSilu>;

// The tile's fp32 accumulators come staged in shared memory ([128 rows][128 columns],
// trimul::EpiTile), so each thread stores 16-byte vectors of 8 channels and four lanes write 64
// contiguous bytes of a row. Walk: lane (r_in = lane % 8, q = lane / 8) of warp w takes
// channels 8q + 32 (w / kRowWarps) + [0, 8) of rows 8 (kItems (w % kRowWarps) + k) + r_in;
// its reads of the 129-float tile rows hit every bank once.
template <int kCols>
struct ChannelWalk {
  static constexpr int kColBlocks = kCols / 32, kRowWarps = Cfg::kThreads / 32 / kColBlocks;
  static constexpr int kItems = Cfg::kBlockM / 8 / kRowWarps;  // rows per lane
  int r_in, col, warp;
  __device__ ChannelWalk()
      : r_in(threadIdx.x % 8), col(((threadIdx.x >> 5) / kRowWarps) * 32 + ((threadIdx.x & 31) / 8) * 8),
        warp(threadIdx.x >> 5) {}
  __device__ int row(int k) const { return ((warp % kRowWarps) * kItems + k) * 8 + r_in; }
};

template <class T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = dev::pack8<T>(v);
}
template <class T>
__device__ __forceinline__ void load8(float (&v)[8], const T* p) {
  dev::unpack8<T>(v, *reinterpret_cast<const uint4*>(p));
}

// The forward's tile: w_up's rows come in 64-row blocks alternating a and b, so the tile's
// columns [0, 64) are a's channels n0 / 2 + [0, 64) and [64, 128) the same channels of b.
template <class T>
struct ProjectSwigluEpilogue {
  T* x;  // [M, 2H] = [a | b], written
  T* y;  // [M, H], written
  int64_t M, H;

  __device__ void operator()(const trimul::EpiTile& t, int64_t m0, int n0, int) const {
    const ChannelWalk<64> w;
    const int64_t j = n0 / 2 + w.col;  // first of the thread's 8 channels
#pragma unroll 2
    for (int k = 0; k < w.kItems; ++k) {
      const int r = w.row(k);
      const int64_t m = m0 + r;
      if (m >= M) continue;
      float a[8], b[8], f[8];  // [e]: channel j + e, a and b as stored (rounded to T)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        a[e] = dev::to_float(dev::from_float<T>(t.at(r, w.col + e)));
        b[e] = dev::to_float(dev::from_float<T>(t.at(r, 64 + w.col + e)));
        f[e] = Silu::value(a[e], sigmoid(a[e])) * b[e];
      }
      store8(x + m * 2 * H + j, a);
      store8(x + m * 2 * H + H + j, b);
      store8(y + m * H + j, f);
    }
  }
};

// The backward's tile: dy for channels n0 + [0, 128) of 128 rows; each thread reads its a, b
// vectors from x and writes da, db and y for them.
template <class T>
struct ProjectSwigluBackwardEpilogue {
  const T* x;  // [M, 2H], the forward's
  T* dx;       // [M, 2H], written
  T* y;        // [M, H], written where given
  int64_t M, H;

  __device__ void operator()(const trimul::EpiTile& t, int64_t m0, int n0, int) const {
    const ChannelWalk<Cfg::kBlockN> w;
    const int64_t j = n0 + w.col;
    if (j >= H) return;  // H is a multiple of 64: a thread's 8 channels are all in or all out
#pragma unroll 2
    for (int k = 0; k < w.kItems; ++k) {
      const int r = w.row(k);
      const int64_t m = m0 + r;
      if (m >= M) continue;
      float a[8], b[8], da[8], db[8], f[8];  // [e]: channel j + e
      load8(a, x + m * 2 * H + j);
      load8(b, x + m * 2 * H + H + j);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float dy = t.at(r, w.col + e), s = sigmoid(a[e]), fa = Silu::value(a[e], s);
        da[e] = dy * b[e] * Silu::slope(a[e], s);
        db[e] = dy * fa;
        f[e] = fa * b[e];
      }
      store8(dx + m * 2 * H + j, da);
      store8(dx + m * 2 * H + H + j, db);
      if (y) store8(y + m * H + j, f);
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
