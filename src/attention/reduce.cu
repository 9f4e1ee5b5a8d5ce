// The small kernels around the backward: Dlt before it; after it, the fixed-order reductions
// that turn the fp32 partials into dQ and dbias.
#include <cuda_runtime.h>

#include "attention/kernels.h"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"

namespace tpf::attn {
namespace {

// delta_kernel's walk: a block takes kRows consecutive rows n of one (b, s, h) slice,
// D / 8 lanes a row, each lane one 16-byte chunk of 8 channels. Blocks run in memory order
// (row tiles of a slice, then the next slice), and the slice and tile come from blockIdx.x in
// 32-bit arithmetic once a thread (a flat 64-bit row index cost five calls of the 64-bit
// division routine a thread).
constexpr int kRowBlockThreads = 256;
template <int D>
struct SliceRow {
  static constexpr int kLanes = D / 8;                     // lanes a row
  static constexpr int kRows = kRowBlockThreads / kLanes;  // rows a block
  static_assert(32 % kLanes == 0, "a row's lanes sit in one warp");
  int b, s, h, n, c;  // slice, row in it, 8-channel chunk of the lane
  int64_t row;        // (b, s, h, n) in the [B,S,H,N] order of lse, delta and dq_acc
  __host__ __device__ static int tiles(const Dims& d) { return (d.N + kRows - 1) / kRows; }
  __device__ explicit SliceRow(const Dims& d) {
    const int t = tiles(d), bsh = blockIdx.x / t;
    h = bsh % d.H;
    s = (bsh / d.H) % d.S;
    b = bsh / (d.H * d.S);
    n = (blockIdx.x - bsh * t) * kRows + threadIdx.x / kLanes;
    c = threadIdx.x % kLanes;
    row = static_cast<int64_t>(bsh) * d.N + n;
  }
  __device__ bool valid(const Dims& d) const { return n < d.N; }
  static unsigned grid(const Dims& d) { return static_cast<unsigned>(int64_t(d.B) * d.S * d.H * tiles(d)); }
};

// Dlt[row] = <dO[row], O[row] (+ R[row])> in fp32, summed over the row's lanes by a fixed
// shuffle tree (the sigmoid gate's backward sums in this order where it gives Dlt: delta_given);
// also the LSE in log2 units for the backward's exp2.
template <class T, int D>
__global__ void __launch_bounds__(kRowBlockThreads) delta_kernel(const BwdArgs a) {
  const SliceRow<D> w(a.dims);
  const bool in = w.valid(a.dims);  // lanes past N stay for the shuffle below, loading nothing
  if (a.delta_given) {
    if (in && w.c == 0) a.lse_log2[w.row] = a.lse[w.row] * 1.4426950408889634f;
    return;
  }
  const int off = 8 * w.c;
  uint4 ov = make_uint4(0, 0, 0, 0), dv = ov, rv = ov;
  if (in) {
    ov = *reinterpret_cast<const uint4*>(slice_ptr<T>(a.out, w.b, w.s, w.h) + w.n * a.out.sn + off);
    dv = *reinterpret_cast<const uint4*>(slice_ptr<T>(a.dout, w.b, w.s, w.h) + w.n * a.dout.sn + off);
    if (a.res.ptr) rv = *reinterpret_cast<const uint4*>(slice_ptr<T>(a.res, w.b, w.s, w.h) + w.n * a.res.sn + off);
  }
  const T* oe = reinterpret_cast<const T*>(&ov);  // [8]
  const T* de = reinterpret_cast<const T*>(&dv);  // [8]
  const T* re = reinterpret_cast<const T*>(&rv);  // [8]; zeros without a residual
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(dev::to_float(de[e]), dev::to_float(oe[e]) + dev::to_float(re[e]), acc);
#pragma unroll
  for (int o = 1; o < SliceRow<D>::kLanes; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o, SliceRow<D>::kLanes);
  if (in && w.c == 0) {
    a.delta[w.row] = acc;
    a.lse_log2[w.row] = a.lse[w.row] * 1.4426950408889634f;
  }
}

// dq = scale * (the C chains' fp32 sums, added in chain order), rounded into the activation dtype;
// 8 elements per thread over a flat grid: where dq is the stacked projection's strided gradient
// this measured faster than delta_kernel's walk (docs/perf-notes.md, fourth session).
template <class T, int D, int C>
__global__ void dq_finalize_kernel(const BwdArgs a) {
  const int64_t rows = static_cast<int64_t>(a.dims.B) * a.dims.S * a.dims.H * a.dims.N;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * (D / 8)) return;
  const int64_t row = i / (D / 8);
  const int c = i % (D / 8);
  const int n = row % a.dims.N, h = (row / a.dims.N) % a.dims.H;
  const int s = (row / (static_cast<int64_t>(a.dims.N) * a.dims.H)) % a.dims.S;
  const int b = row / (static_cast<int64_t>(a.dims.N) * a.dims.H * a.dims.S);
  const float4* src = reinterpret_cast<const float4*>(a.dq_acc + row * D + 8 * c);
  float4 x = src[0], y = src[1];
#pragma unroll
  for (int ch = 1; ch < C; ++ch) {
    const float4* more = reinterpret_cast<const float4*>(a.dq_acc + ch * rows * D + row * D + 8 * c);
    const float4 x1 = more[0], y1 = more[1];
    x = make_float4(x.x + x1.x, x.y + x1.y, x.z + x1.z, x.w + x1.w);
    y = make_float4(y.x + y1.x, y.y + y1.y, y.z + y1.z, y.w + y1.w);
  }
  uint4 out;
  out.x = dev::MmaOp<T>::pack(x.x * a.scale, x.y * a.scale);
  out.y = dev::MmaOp<T>::pack(x.z * a.scale, x.w * a.scale);
  out.z = dev::MmaOp<T>::pack(y.x * a.scale, y.y * a.scale);
  out.w = dev::MmaOp<T>::pack(y.z * a.scale, y.w * a.scale);
  *reinterpret_cast<uint4*>(slice_ptr_mut<T>(a.dq, b, s, h) + n * a.dq.sn + 8 * c) = out;
}

// dbias[b,0,h,q,k] = sum over chunks c, in order, of part[c,b,h,k,q] (rows padded): a 32 x 32 tile per
// block of 32 x kDbiasRows threads, transposed through shared memory so both sides are read and
// written along rows.
constexpr int kDbiasRows = 8;
template <class T>
__global__ void dbias_reduce_kernel(const BwdArgs a) {
  constexpr int kRows = 32 / kDbiasRows;  // rows a thread sums
  constexpr int kBatch = 8;               // chunks whose loads are in flight at once: each load
                                          // is a round trip, and the adds wait on them in order
  __shared__ float tile[32][33];
  const int N = a.dims.N, H = a.dims.H;
  const int b = blockIdx.z / H, h = blockIdx.z % H;
  const int q0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
  const int64_t plane = static_cast<int64_t>(a.part_rows) * a.part_cols;  // one (b, h)
  const int64_t stride_c = static_cast<int64_t>(a.dims.B) * H * plane;
  const float* part = a.dbias_part + (static_cast<int64_t>(b) * H + h) * plane;
  const int q = q0 + threadIdx.x;
  float sum[kRows];  // rows threadIdx.y + kDbiasRows i
  const float* src[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int k = k0 + threadIdx.y + kDbiasRows * i;
    sum[i] = 0.f;
    src[i] = k < N && q < N ? part + static_cast<int64_t>(k) * a.part_cols + q : nullptr;
  }
  for (int c = 0; c < a.chunks; c += kBatch) {
    float v[kRows][kBatch];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int u = 0; u < kBatch; ++u) v[i][u] = src[i] && c + u < a.chunks ? src[i][(c + u) * stride_c] : 0.f;
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (c + u < a.chunks) sum[i] += v[i][u];  // chunk order, as one at a time
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) tile[threadIdx.y + kDbiasRows * i][threadIdx.x] = sum[i];
  __syncthreads();
  const int64_t base = b * a.dbias.sb + h * a.dbias.sh;
  for (int r = threadIdx.y; r < 32; r += kDbiasRows) {
    const int q = q0 + r, k = k0 + threadIdx.x;
    if (q >= N || k >= N) continue;
    const float v = tile[threadIdx.x][r];
    const int64_t off = base + q * a.dbias.sq + k * a.dbias.sk;
    if (a.dbias.fp32) static_cast<float*>(a.dbias.ptr)[off] = v;
    else static_cast<T*>(a.dbias.ptr)[off] = dev::from_float<T>(v);
  }
}

template <class T, int D>
cudaError_t preprocess(const BwdArgs& a, cudaStream_t stream) {
  delta_kernel<T, D><<<SliceRow<D>::grid(a.dims), kRowBlockThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <class T, int D>
cudaError_t reduce(const BwdArgs& a, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(a.dims.B) * a.dims.S * a.dims.H * a.dims.N;
  const unsigned blocks = static_cast<unsigned>((rows * (D / 8) + 255) / 256);
  constexpr int kTwo = D == 32 ? 2 : 1;  // only D = 32 takes two chains (tile_config.h's bwd_dq_chains)
  if (a.dq_chains == 2) {
    dq_finalize_kernel<T, D, kTwo><<<blocks, 256, 0, stream>>>(a);
  } else {
    dq_finalize_kernel<T, D, 1><<<blocks, 256, 0, stream>>>(a);
  }
  if (a.dbias.ptr) {
    const dim3 grid((a.dims.N + 31) / 32, (a.dims.N + 31) / 32, a.dims.B * a.dims.H);
    dbias_reduce_kernel<T><<<grid, dim3(32, kDbiasRows), 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

#define TPF_DISPATCH(fn)                                                                   \
  switch (head_dim) {                                                                      \
    case 16: return fp16 ? fn<__half, 16>(a, stream) : fn<__nv_bfloat16, 16>(a, stream);   \
    case 32: return fp16 ? fn<__half, 32>(a, stream) : fn<__nv_bfloat16, 32>(a, stream);   \
    case 64: return fp16 ? fn<__half, 64>(a, stream) : fn<__nv_bfloat16, 64>(a, stream);   \
    case 128: return fp16 ? fn<__half, 128>(a, stream) : fn<__nv_bfloat16, 128>(a, stream); \
  }                                                                                        \
  return cudaErrorInvalidValue;

cudaError_t launch_backward_preprocess(const BwdArgs& a, bool fp16, int head_dim,
                                       cudaStream_t stream) {
  TPF_DISPATCH(preprocess)
}

cudaError_t launch_backward_reduce(const BwdArgs& a, bool fp16, int head_dim,
                                   cudaStream_t stream) {
  TPF_DISPATCH(reduce)
}

}  // namespace tpf::attn
