// LayerNorm forward and backward over the channels of each pixel, for pixel-major inputs (z)
// and channel-major ones (the triangle product's x, transposed through shared memory).
//
// Row groups: eight lanes hold one pixel row, four rows per warp; lane l8 of a group holds the
// 4-channel units u < W / 32 at channels 4 (l8 + 8u) .. + 3 (8-byte loads and stores; one
// instruction moves 64 contiguous bytes of each of four rows). Per-row work (index arithmetic,
// the statistics' shuffle trees, three levels deep) is shared by four rows per instruction:
// with one row per warp these kernels were issue-bound at ~290 instructions per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/kernel_attrs.h"
#include "common/mma.cuh"
#include "trimul/kernels.h"
#include "common/row_math.cuh"
#include "trimul/tile_config.h"

namespace tpf::trimul {
namespace {

using rows::aligned8;
using rows::group_sum;
using rows::kGroupLanes;
using rows::load4;
using rows::norm_backward;
using rows::row_stats;
using rows::store4;

constexpr int kRowsPerWarp = 32 / kGroupLanes;
constexpr int kRowsPerBlock = kRowWarps * kRowsPerWarp;
constexpr int kUnits = 256 / (4 * kGroupLanes);  // 4-channel units per lane at W = 256
constexpr int kVals = 4 * kUnits;
static_assert(kRowsPerBlock == kColPixels, "a channel-major block's pixels are one block of row groups");

struct Slot {
  int row;  // row of the block, [0, kRowsPerBlock)
  int l8;   // lane in the row's group
  __device__ Slot() : row(threadIdx.x / kGroupLanes), l8(threadIdx.x % kGroupLanes) {}
  __device__ int channel(int u) const { return rows::unit_channel(l8, u); }
};

// Normalises a group's row (pixel m) into xhat (and xhat_bf) and writes its statistics where asked.
// Every lane of the warp must call it (full-warp shuffles); rows past M (in == false) write nothing.
// kHiLo: xhat_bf rows are [high parts | low parts] ([M][2W], xhat = high + low to ~16 bits).
template <bool kHiLo, int kV>
__device__ __forceinline__ void normalize_row(const Slot& sl, const float (&v)[kV], int W, float eps,
                                              int64_t m, bool in, __half* xhat, __nv_bfloat16* xhat_bf,
                                              float* mean, float* rstd) {
  const float2 st = row_stats(v, W, eps);
  if (!in) return;
#pragma unroll
  for (int u = 0; u < kV / 4; ++u) {
    if (u >= W / 32) break;
    float y[4];  // [channel] normalised
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = (v[4 * u + e] - st.x) * st.y;
    store4(xhat + m * W + sl.channel(u), y, true);
    if (!xhat_bf) continue;
    __nv_bfloat16* hi = xhat_bf + m * (kHiLo ? 2 * W : W) + sl.channel(u);
    store4(hi, y, true);
    if constexpr (kHiLo) {
      float lo[4];  // what the high part leaves
#pragma unroll
      for (int e = 0; e < 4; ++e) lo[e] = y[e] - __bfloat162float(__float2bfloat16_rn(y[e]));
      store4(hi + W, lo, true);
    }
  }
  if (mean && sl.l8 == 0) mean[m] = st.x, rstd[m] = st.y;
}

// kU: 4-channel units a lane holds (W <= 32 kU): the registers of W <= 128 rows are what keep
// enough blocks resident for these bandwidth-bound kernels to have their loads in flight.
template <int kU>
__global__ void __launch_bounds__(kRowWarps * 32)
    ln_rows_forward_kernel(PairRef z, Dims d, float eps, int64_t r0, int64_t r1, __half* xhat,
                           __nv_bfloat16* xhat_bf, float* mean, float* rstd) {
  const Slot sl;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + sl.row, m = r0 + row;  // output row, pixel
  const int W = static_cast<int>(d.C);
  const bool in = m < r1;
  const auto* src = static_cast<const __nv_bfloat16*>(z.ptr) + (in ? pair_offset(z, m, d.N) : 0);
  const bool vec = aligned8(src);  // a strided view may leave rows unaligned
  float v[4 * kU] = {};  // [4u + e] channel sl.channel(u) + e
#pragma unroll
  for (int u = 0; u < kU; ++u)
    if (in && u < W / 32) load4(v + 4 * u, src + sl.channel(u), vec);
  normalize_row<true>(sl, v, W, eps, row, in, xhat, xhat_bf, mean ? mean + r0 : nullptr, rstd ? rstd + r0 : nullptr);
}

// dz (Tdz) = the row's LayerNorm backward, plus dz_in where given (read first: it may be dz).
template <class Tdz>
__global__ void __launch_bounds__(kRowWarps * 32)
    ln_rows_backward_kernel(const float* dxhat, PairRef z, Dims d, const float* mean,
                            const float* rstd, PairRef dz, PairRef dz_in) {
  const Slot sl;
  const int64_t m = int64_t(blockIdx.x) * kRowsPerBlock + sl.row;
  const bool in = m < d.M();  // rows past M still join the shuffles (full-warp masks)
  const int W = static_cast<int>(d.C);
  const auto* src = static_cast<const __nv_bfloat16*>(z.ptr) + (in ? pair_offset(z, m, d.N) : 0);
  auto* dst = static_cast<Tdz*>(dz.ptr) + (in ? pair_offset(dz, m, d.N) : 0);
  float add[kVals] = {};  // [4u + e] dz_in at channel sl.channel(u) + e
  if (dz_in.ptr && in) {
    const Tdz* a = static_cast<const Tdz*>(dz_in.ptr) + pair_offset(dz_in, m, d.N);
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
      if (u < W / 32) load4(add + 4 * u, a + sl.channel(u), rows::aligned4(a));
  }
  const float mu = in ? mean[m] : 0.f, rs = in ? rstd[m] : 0.f;
  float xh[kVals] = {}, g[kVals] = {};  // [4u + e] channel sl.channel(u) + e
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (!in || u >= W / 32) continue;
    load4(xh + 4 * u, src + sl.channel(u), aligned8(src));
    load4(g + 4 * u, dxhat + m * W + sl.channel(u), true);
#pragma unroll
    for (int e = 0; e < 4; ++e) xh[4 * u + e] = (xh[4 * u + e] - mu) * rs;
  }
  norm_backward(g, xh, W, rs);
  if (!in) return;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (u >= W / 32) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) g[4 * u + e] += add[4 * u + e];
    store4(dst + sl.channel(u), g + 4 * u, rows::aligned4(dst));
  }
}

// Channel-major tiles: the block's kColPixels consecutive pixels x Ch channels in shared memory
// as [channel][pixel] fp32, rows padded by one float. The group reads (channel 4 (l8 + 8u) + e,
// pixel row) then hit banks 4 l8 + row + const: conflict-free, as are the 8-pixel transfers below.
constexpr int kColStride = kColPixels + 1;

// x (channel-major bf16) of the block's pixels into tile[c][p]. With N % 8 == 0 (no row pads,
// 8-pixel groups never straddle a matrix row) 16-byte loads of 8 pixels; otherwise one pixel
// per thread and load.
__device__ __forceinline__ void load_channel_major(float* tile, const __nv_bfloat16* x, const Dims& d, int64_t m0) {
  const int W = static_cast<int>(d.Ch);
  if (d.N % 8 == 0) {
    for (int it = threadIdx.x; it < W * (kColPixels / 8); it += kRowWarps * 32) {
      const int c = it / (kColPixels / 8), g = it % (kColPixels / 8);  // channel, 8-pixel group
      const int64_t m = m0 + 8 * g;
      float v[8] = {};  // [pixel]
      if (m < d.M()) dev::unpack8<__nv_bfloat16>(v, *reinterpret_cast<const uint4*>(x + cm_offset(d, m, c)));
#pragma unroll
      for (int e = 0; e < 8; ++e) tile[c * kColStride + 8 * g + e] = v[e];
    }
  } else {
    const int p = threadIdx.x % kColPixels;
    const int64_t m = m0 + p;
    const int64_t base = m < d.M() ? cm_offset(d, m, 0) : 0;
    for (int c = threadIdx.x / kColPixels; c < W; c += kRowWarps * 32 / kColPixels)
      tile[c * kColStride + p] = m < d.M() ? __bfloat162float(x[base + c * d.plane()]) : 0.f;
  }
}

// tile[c][p] (fp32) into dx (channel-major bf16) for the block's pixels; the pixel at the end of
// a matrix row also zeroes that row's pads (N % 8 != 0 only: otherwise there are none).
__device__ __forceinline__ void store_channel_major(__nv_bfloat16* dx, const float* tile, const Dims& d, int64_t m0) {
  const int W = static_cast<int>(d.Ch);
  if (d.N % 8 == 0) {
    for (int it = threadIdx.x; it < W * (kColPixels / 8); it += kRowWarps * 32) {
      const int c = it / (kColPixels / 8), g = it % (kColPixels / 8);
      const int64_t m = m0 + 8 * g;
      if (m >= d.M()) continue;
      float v[8];  // [pixel]
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = tile[c * kColStride + 8 * g + e];
      *reinterpret_cast<uint4*>(dx + cm_offset(d, m, c)) = dev::pack8<__nv_bfloat16>(v);
    }
  } else {
    const int p = threadIdx.x % kColPixels;
    const int64_t m = m0 + p;
    if (m >= d.M()) return;
    const int64_t base = cm_offset(d, m, 0);
    const bool row_end = m % d.N == d.N - 1;
    for (int c = threadIdx.x / kColPixels; c < W; c += kRowWarps * 32 / kColPixels) {
      __nv_bfloat16* o = dx + base + c * d.plane();
      o[0] = __float2bfloat16_rn(tile[c * kColStride + p]);
      if (row_end)
        for (int64_t j = 1; j < d.Np - d.N + 1; ++j) o[j] = __float2bfloat16_rn(0.f);
    }
  }
}

// A group's row (block pixel sl.row) from the tile.
template <int kV>
__device__ __forceinline__ void tile_row(float (&v)[kV], const float* tile, const Slot& sl, int W) {
#pragma unroll
  for (int u = 0; u < kV / 4; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      v[4 * u + e] = u < W / 32 ? tile[(sl.channel(u) + e) * kColStride + sl.row] : 0.f;
}

template <int kU>  // as ln_rows_forward_kernel's
__global__ void __launch_bounds__(kRowWarps * 32)
    ln_cm_forward_kernel(const __nv_bfloat16* x, Dims d, float eps, __half* xhat,
                         __nv_bfloat16* xhat_bf, float* mean, float* rstd) {
  extern __shared__ float tile[];  // [Ch][kColStride]
  const int64_t m0 = int64_t(blockIdx.x) * kColPixels;
  load_channel_major(tile, x, d, m0);
  __syncthreads();
  const Slot sl;
  const int64_t m = m0 + sl.row;
  const int W = static_cast<int>(d.Ch);
  float v[4 * kU];  // rows past M read the tile's zeros
  tile_row(v, tile, sl, W);
  normalize_row<false>(sl, v, W, eps, m, m < d.M(), xhat, xhat_bf, mean, rstd);
}

__global__ void __launch_bounds__(kRowWarps * 32)
    ln_cm_backward_kernel(const float* dxhat, const __nv_bfloat16* x, Dims d,
                          const float* mean, const float* rstd, __nv_bfloat16* dx) {
  extern __shared__ float tile[];  // [Ch][kColStride]: x, then d x
  const int W = static_cast<int>(d.Ch);
  const int64_t m0 = int64_t(blockIdx.x) * kColPixels;
  load_channel_major(tile, x, d, m0);
  __syncthreads();
  const Slot sl;
  const int64_t m = m0 + sl.row;
  const bool in = m < d.M();
  float xh[kVals], g[kVals] = {};  // [4u + e] channel sl.channel(u) + e
  tile_row(xh, tile, sl, W);
  const float mu = in ? mean[m] : 0.f, rs = in ? rstd[m] : 0.f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (!in || u >= W / 32) continue;
    load4(g + 4 * u, dxhat + m * W + sl.channel(u), true);
#pragma unroll
    for (int e = 0; e < 4; ++e) xh[4 * u + e] = (xh[4 * u + e] - mu) * rs;
  }
  norm_backward(g, xh, W, rs);  // every lane: full-warp shuffles
  __syncthreads();  // every group has read its x row: the tile now takes d x
  if (in)
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (u < W / 32) tile[(sl.channel(u) + e) * kColStride + sl.row] = g[4 * u + e];
  __syncthreads();
  store_channel_major(dx, tile, d, m0);
}

unsigned row_blocks(const Dims& d) { return static_cast<unsigned>((d.M() + kRowsPerBlock - 1) / kRowsPerBlock); }
unsigned col_blocks(const Dims& d) { return static_cast<unsigned>((d.M() + kColPixels - 1) / kColPixels); }

template <class K>
cudaError_t allow_smem(K* kernel, size_t bytes) {
  return tpf::detail::allow_dynamic_smem(kernel, static_cast<int>(bytes));
}

}  // namespace

cudaError_t ln_rows_forward(const Problem& p, void* xhat, void* xhat_bf, float* mean,
                            float* rstd, cudaStream_t s, int64_t r0, int64_t r1) {
  if (r1 < 0) r1 = p.d.M();
  if (r1 <= r0) return cudaSuccess;
  auto* kernel = p.d.C <= 128 ? ln_rows_forward_kernel<4> : ln_rows_forward_kernel<kUnits>;
  const auto blocks = static_cast<unsigned>((r1 - r0 + kRowsPerBlock - 1) / kRowsPerBlock);
  kernel<<<blocks, kRowWarps * 32, 0, s>>>(p.z, p.d, p.eps, r0, r1, static_cast<__half*>(xhat),
                                           static_cast<__nv_bfloat16*>(xhat_bf), mean, rstd);
  return cudaGetLastError();
}

cudaError_t ln_channel_major_forward(const Problem& p, const void* x, void* xhat, void* xhat_bf,
                                     float* mean, float* rstd, cudaStream_t s) {
  const size_t smem = p.d.Ch * kColStride * sizeof(float);
  auto* kernel = p.d.Ch <= 128 ? ln_cm_forward_kernel<4> : ln_cm_forward_kernel<kUnits>;
  if (auto e = allow_smem(kernel, smem); e != cudaSuccess) return e;
  kernel<<<col_blocks(p.d), kRowWarps * 32, smem, s>>>(
      static_cast<const __nv_bfloat16*>(x), p.d, p.eps, static_cast<__half*>(xhat),
      static_cast<__nv_bfloat16*>(xhat_bf), mean, rstd);
  return cudaGetLastError();
}

cudaError_t ln_rows_backward(const Problem& p, const float* dxhat, const float* mean,
                             const float* rstd, cudaStream_t s) {
  if (p.dz_f32)
    ln_rows_backward_kernel<float><<<row_blocks(p.d), kRowWarps * 32, 0, s>>>(dxhat, p.z, p.d, mean, rstd, p.dz, p.dz_in);
  else
    ln_rows_backward_kernel<__nv_bfloat16>
        <<<row_blocks(p.d), kRowWarps * 32, 0, s>>>(dxhat, p.z, p.d, mean, rstd, p.dz, p.dz_in);
  return cudaGetLastError();
}

cudaError_t ln_channel_major_backward(const Problem& p, const float* dxhat, const void* x,
                                      const float* mean, const float* rstd, void* dx,
                                      cudaStream_t s) {
  const size_t smem = p.d.Ch * kColStride * sizeof(float);
  if (auto e = allow_smem(ln_cm_backward_kernel, smem); e != cudaSuccess) return e;
  ln_cm_backward_kernel<<<col_blocks(p.d), kRowWarps * 32, smem, s>>>(
      dxhat, static_cast<const __nv_bfloat16*>(x), p.d, mean,
      rstd, static_cast<__nv_bfloat16*>(dx));
  return cudaGetLastError();
}

}  // namespace tpf::trimul
