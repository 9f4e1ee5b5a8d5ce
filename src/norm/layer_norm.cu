// LayerNorm forward and backward over contiguous rows of W <= 256 channels.
//
// Row groups as in common/row_math.cuh: eight lanes per row, four rows per warp, eight warps per
// block (32 rows); the backward puts sixteen lanes on a row when W is a multiple of 64 (half the
// registers a lane, so more blocks per SM keep loads in flight). The forward reads x once and
// writes y in the consumer's precision; the
// backward reads x and dy once, writes dx, and keeps each lane's share of the weight and bias
// gradients (sum dy xhat, sum dy) in registers over the rows it walks. Blocks walk a fixed
// set of row tiles (a grid that depends on the row count only), and their partials are summed
// in block order: the gradients are bitwise repeatable on any GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/mma.cuh"
#include "common/dtype_pairs.cuh"
#include "common/row_math.cuh"
#include "norm/kernels.h"

namespace tpf::norm {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
template <int L = rows::kGroupLanes>
constexpr int kRowsPerBlock = kWarps * (32 / L);
constexpr int kMaxW = 256;
// Backward grid: enough blocks that each SM holds several (the kernel is bandwidth-bound and
// wants loads in flight), few enough that the partials stay small (2 MB at W = 256).
constexpr int kBackwardBlocks = 1024;

template <int L = rows::kGroupLanes>
__host__ __device__ inline int64_t tiles(const Rows& r) { return (r.rows + kRowsPerBlock<L> - 1) / kRowsPerBlock<L>; }
// The backward's lanes a row: 16 where they divide the row into whole 4-channel units.
constexpr int kWideLanes = 16;
bool wide_backward(const Rows& r) { return r.W % (4 * kWideLanes) == 0; }
int backward_blocks(const Rows& r) {
  const int64_t t = wide_backward(r) ? tiles<kWideLanes>(r) : tiles(r);
  return static_cast<int>(t < kBackwardBlocks ? t : kBackwardBlocks);
}

__device__ __forceinline__ float param_at(Param p, int c, float absent) {
  if (!p.ptr) return absent;
  switch (p.dtype) {
    case DType::kBF16: return dev::to_float(static_cast<const __nv_bfloat16*>(p.ptr)[c]);
    case DType::kFP16: return dev::to_float(static_cast<const __half*>(p.ptr)[c]);
    default: return static_cast<const float*>(p.ptr)[c];
  }
}

// The block's copy of weight and bias as fp32: [2][kMaxW] in shared memory.
__device__ __forceinline__ void stage_params(float* s, Param w, Param b, int W) {
  for (int c = threadIdx.x; c < W; c += kThreads) s[c] = param_at(w, c, 1.f), s[kMaxW + c] = param_at(b, c, 0.f);
  __syncthreads();
}

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// This thread's place: row `row` of the block's kRowsPerBlock<L>, lane l of its group.
template <int L = rows::kGroupLanes>
struct Slot {
  int row = threadIdx.x / L, l = threadIdx.x % L;
  __device__ int channel(int u) const { return rows::unit_channel<L>(l, u); }
};

template <class Tx, class Ty, int kUnits>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(Rows r, const Tx* x, Param weight, Param bias, Ty* y, float* mean, float* rstd) {
  __shared__ float wb[2 * kMaxW];  // [weight | bias]
  stage_params(wb, weight, bias, r.W);
  const Slot<> sl;
  const int64_t m = int64_t(blockIdx.x) * kRowsPerBlock<> + sl.row;
  const bool in = m < r.rows;  // rows past the end still join the group's shuffles
  const Tx* src = x + (in ? m : 0) * r.W;
  Ty* dst = y + (in ? m : 0) * r.W;
  const bool vx = aligned16(x), vy = aligned16(y);
  float v[4 * kUnits] = {};  // [4u + e] channel sl.channel(u) + e
#pragma unroll
  for (int u = 0; u < kUnits; ++u)
    if (in && u < r.W / 32) rows::load4(v + 4 * u, src + sl.channel(u), vx);
  const float2 st = rows::row_stats(v, r.W, r.eps);
  if (!in) return;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (u >= r.W / 32) break;
    const int c = sl.channel(u);
    float o[4];  // [e] channel c + e
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = (v[4 * u + e] - st.x) * st.y * wb[c + e] + wb[kMaxW + c + e];
    rows::store4(dst + c, o, vy);
  }
  if (mean && sl.l == 0) mean[m] = st.x, rstd[m] = st.y;
}

// The block's (sum dy xhat, sum dy) per channel into partials[blockIdx.x][2W], from each lane's
// sums over its rows: the warp's four row groups by a shuffle tree, then the warps in order.
template <int L, int kUnits>
__device__ __forceinline__ void block_partials(float (&sw)[4 * kUnits], float (&sb)[4 * kUnits], float* smem,
                                               int W, const Slot<L>& sl, float* partials) {
#pragma unroll
  for (int o = L; o < 32; o <<= 1)
#pragma unroll
    for (int i = 0; i < 4 * kUnits; ++i) {
      sw[i] += __shfl_xor_sync(0xffffffffu, sw[i], o);
      sb[i] += __shfl_xor_sync(0xffffffffu, sb[i], o);
    }
  const int warp = threadIdx.x / 32;
  float* mine = smem + warp * 2 * kMaxW;  // [kWarps][2][kMaxW]
  if (threadIdx.x % 32 < L)
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (u < W / (4 * L)) mine[sl.channel(u) + e] = sw[4 * u + e], mine[kMaxW + sl.channel(u) + e] = sb[4 * u + e];
  __syncthreads();
  for (int j = threadIdx.x; j < 2 * W; j += kThreads) {
    const int at = j < W ? j : kMaxW + j - W;
    float t = 0.f;
    for (int w = 0; w < kWarps; ++w) t += smem[w * 2 * kMaxW + at];
    partials[int64_t(blockIdx.x) * 2 * W + j] = t;
  }
}

template <class Tx, class Tdy, int L, int kUnits>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(Rows r, const Tx* x, const Tdy* dy, Param weight, const float* mean, const float* rstd,
                    Tx* dx, const Tx* dx_in, float* partials) {
  __shared__ float smem[kWarps * 2 * kMaxW];  // weight first, then the warps' partials
  stage_params(smem, weight, Param{nullptr, DType::kFP32}, r.W);
  const Slot<L> sl;
  const bool vx = aligned16(x), vdy = aligned16(dy), vdx = aligned16(dx) && aligned16(dx_in);
  float sw[4 * kUnits] = {}, sb[4 * kUnits] = {};  // this lane's sum dy xhat, sum dy
  for (int64_t t = blockIdx.x; t < tiles<L>(r); t += gridDim.x) {
    const int64_t m = t * kRowsPerBlock<L> + sl.row;
    const bool in = m < r.rows;
    const float mu = in ? mean[m] : 0.f, rs = in ? rstd[m] : 0.f;
    // [4u + e] channel sl.channel(u) + e: xhat; dy, then d xhat, then dx; the dx_in addend.
    // All three loads are issued before any use, so a row costs one memory round trip.
    float xh[4 * kUnits] = {}, g[4 * kUnits] = {}, add[4 * kUnits] = {};
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (!in || u >= r.W / (4 * L)) continue;
      rows::load4(xh + 4 * u, x + m * r.W + sl.channel(u), vx);
      rows::load4(g + 4 * u, dy + m * r.W + sl.channel(u), vdy);
      if (dx_in) rows::load4(add + 4 * u, dx_in + m * r.W + sl.channel(u), vdx);  // read before dx's store: may be dx
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * u + e;
        xh[i] = (xh[i] - mu) * rs;
        sw[i] += g[i] * xh[i], sb[i] += g[i];
        g[i] *= u < r.W / (4 * L) ? smem[sl.channel(u) + e] : 0.f;  // the weight (stage_params)
      }
    rows::norm_backward<L>(g, xh, r.W, rs);
    if (!in) continue;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (u >= r.W / (4 * L)) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) g[4 * u + e] += add[4 * u + e];
      rows::store4(dx + m * r.W + sl.channel(u), g + 4 * u, vdx);
    }
  }
  if (!partials) return;
  __syncthreads();  // the weight copy is read; the area now takes the partials
  block_partials<L, kUnits>(sw, sb, smem, r.W, sl, partials);
}

__device__ __forceinline__ void store(Grad out, int c, float t) {
  switch (out.dtype) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(out.ptr)[c] = dev::from_float<__nv_bfloat16>(t); break;
    case DType::kFP16: static_cast<__half*>(out.ptr)[c] = dev::from_float<__half>(t); break;
    default: static_cast<float*>(out.ptr)[c] = t;
  }
}

// dweight[c] = sum over blocks of partials[b][c], dbias from columns W + c, in block order.
__global__ void finalize_kernel(const float* partials, int blocks, int W, Grad dweight, Grad dbias) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= 2 * W) return;
  float t = 0.f;
  for (int b = 0; b < blocks; ++b) t += partials[int64_t(b) * 2 * W + j];
  const Grad out = j < W ? dweight : dbias;
  const int c = j < W ? j : j - W;
  if (out.ptr) store(out, c, t);
}

}  // namespace

size_t backward_partials_bytes(const Rows& r) { return size_t(backward_blocks(r)) * 2 * r.W * sizeof(float); }

cudaError_t forward(const Rows& r, const void* x, DType x_dtype, Param weight, Param bias, void* y,
                    DType y_dtype, float* mean, float* rstd, cudaStream_t s) {
  if (r.rows == 0) return cudaSuccess;
  return dev::with_mixed_pair(x_dtype, y_dtype, [&](auto tx, auto ty) {
    using Tx = decltype(tx);
    using Ty = decltype(ty);
    auto* kernel = r.W <= 128 ? forward_kernel<Tx, Ty, 4> : forward_kernel<Tx, Ty, 8>;
    kernel<<<static_cast<unsigned>(tiles(r)), kThreads, 0, s>>>(r, static_cast<const Tx*>(x), weight, bias,
                                                                 static_cast<Ty*>(y), mean, rstd);
    return cudaGetLastError();
  });
}

cudaError_t backward(const Rows& r, const void* x, DType x_dtype, const void* dy, DType dy_dtype,
                     Param weight, const float* mean, const float* rstd, void* dx, const void* dx_in, Grad dweight,
                     Grad dbias, float* partials, cudaStream_t s) {
  const bool grads = dweight.ptr || dbias.ptr;
  if (r.rows == 0) {  // empty sums: zero gradients
    cudaError_t e = cudaSuccess;
    for (const Grad& g : {dweight, dbias})
      if (g.ptr && e == cudaSuccess) e = cudaMemsetAsync(g.ptr, 0, size_t(r.W) * (g.dtype == DType::kFP32 ? 4 : 2), s);
    return e;
  }
  const cudaError_t e = dev::with_mixed_pair(x_dtype, dy_dtype, [&](auto tx, auto tdy) {
    using Tx = decltype(tx);
    using Tdy = decltype(tdy);
    // 16 lanes: W = 64, 128 in 2 units a lane, 192, 256 in 4; other widths 8 lanes, up to 8 units.
    auto* kernel = !wide_backward(r) ? backward_kernel<Tx, Tdy, 8, 8>
                   : r.W <= 128      ? backward_kernel<Tx, Tdy, kWideLanes, 2>
                                     : backward_kernel<Tx, Tdy, kWideLanes, 4>;
    kernel<<<backward_blocks(r), kThreads, 0, s>>>(r, static_cast<const Tx*>(x), static_cast<const Tdy*>(dy),
                                                   weight, mean, rstd, static_cast<Tx*>(dx),
                                                   static_cast<const Tx*>(dx_in),
                                                   grads ? partials : nullptr);
    return cudaGetLastError();
  });
  if (e != cudaSuccess || !grads) return e;
  finalize_kernel<<<(2 * r.W + 255) / 256, 256, 0, s>>>(partials, backward_blocks(r), r.W, dweight, dbias);
  return cudaGetLastError();
}

}  // namespace tpf::norm
