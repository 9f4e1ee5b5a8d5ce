// LayerNorm forward and backward over the channels of each pixel, for pixel-major inputs (z)
// and channel-major ones (the triangle product's x, transposed through shared memory).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/mma.cuh"
#include "trimul/kernels.h"
#include "trimul/tile_config.h"

namespace tpf::trimul {
namespace {

constexpr int kMaxPerLane = 8;  // 256 channels / 32 lanes

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Which channel a lane's value k holds: kStrided, channel lane + 32k (one value per load);
// kQuads, channel 4 (lane + 32 (k / 4)) + k % 4 (four consecutive channels per 8-byte load).
enum class RowLayout { kStrided, kQuads };
template <RowLayout L>
__device__ __forceinline__ int channel_of(int k, int lane) {
  return L == RowLayout::kStrided ? lane + 32 * k : 4 * (lane + 32 * (k / 4)) + k % 4;
}

// Mean and 1/sqrt(var + eps) of the W values v[k] spread over a warp (channels < W count).
template <RowLayout L = RowLayout::kStrided>
__device__ __forceinline__ float2 row_stats(const float (&v)[kMaxPerLane], int W, float eps) {
  const int lane = threadIdx.x & 31;
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) s += channel_of<L>(k, lane) < W ? v[k] : 0.f;
  const float mean = warp_sum(s) / W;
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) q += channel_of<L>(k, lane) < W ? (v[k] - mean) * (v[k] - mean) : 0.f;
  return make_float2(mean, rsqrtf(warp_sum(q) / W + eps));
}

// d x of the normalisation from g = d xhat and xhat (both per lane), in place in g.
template <RowLayout L = RowLayout::kStrided>
__device__ __forceinline__ void norm_backward(float (&g)[kMaxPerLane], const float (&xh)[kMaxPerLane],
                                              int W, float rstd) {
  const int lane = threadIdx.x & 31;
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k)
    if (channel_of<L>(k, lane) < W) sg += g[k], sgx += g[k] * xh[k];
  const float mg = warp_sum(sg) / W, mgx = warp_sum(sgx) / W;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) g[k] = rstd * (g[k] - mg - xh[k] * mgx);
}

// Writes one normalised value in fp16 and, where requested, bf16.
__device__ __forceinline__ void put(__half* h, __nv_bfloat16* b, int64_t i, float v) {
  h[i] = __float2half_rn(v);
  if (b) b[i] = __float2bfloat16_rn(v);
}

// Normalises row m, held by a warp (v[k] = channel lane + 32k), into xhat (and xhat_bf) and
// writes its statistics where requested.
__device__ __forceinline__ void normalize_row(const float (&v)[kMaxPerLane], int W, float eps,
                                              int64_t m, int lane, __half* xhat,
                                              __nv_bfloat16* xhat_bf, float* mean, float* rstd) {
  const float2 st = row_stats(v, W, eps);
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k)
    if (k * 32 < W) put(xhat, xhat_bf, m * W + k * 32 + lane, (v[k] - st.x) * st.y);
  if (mean && lane == 0) mean[m] = st.x, rstd[m] = st.y;
}

// Four consecutive channels of a 16-bit row as floats (8-byte load when aligned).
__device__ __forceinline__ void load4(float* v, const __nv_bfloat16* src, bool vec) {
  if (vec) {
    const uint2 u = *reinterpret_cast<const uint2*>(src);
    const float2 lo = dev::pair_to_float2<__nv_bfloat16>(u.x), hi = dev::pair_to_float2<__nv_bfloat16>(u.y);
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = __bfloat162float(src[e]);
  }
}

// One warp per pixel; each lane loads and stores four consecutive channels at a time (8-byte
// accesses: a 128-channel row is one load and one store instruction per warp). z rows that a
// strided view leaves unaligned are read element by element.
__global__ void __launch_bounds__(kRowWarps * 32)
    ln_rows_forward_kernel(PairRef z, Dims d, float eps, __half* xhat, __nv_bfloat16* xhat_bf,
                           float* mean, float* rstd) {
  constexpr auto kQ = RowLayout::kQuads;
  const int lane = threadIdx.x & 31;
  const int64_t m = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (m >= d.M()) return;
  const auto* src = static_cast<const __nv_bfloat16*>(z.ptr) + pair_offset(z, m, d.N);
  const int W = static_cast<int>(d.C);
  const bool vec = reinterpret_cast<uintptr_t>(src) % 8 == 0;
  float v[kMaxPerLane];  // [value] channel channel_of<kQuads>(k, lane)
#pragma unroll
  for (int q = 0; q < kMaxPerLane / 4; ++q) {
    const int c = channel_of<kQ>(4 * q, lane);
    if (c >= W) v[4 * q] = v[4 * q + 1] = v[4 * q + 2] = v[4 * q + 3] = 0.f;
    else load4(v + 4 * q, src + c, vec);
  }
  const float2 st = row_stats<kQ>(v, W, eps);
#pragma unroll
  for (int q = 0; q < kMaxPerLane / 4; ++q) {
    const int c = channel_of<kQ>(4 * q, lane);
    if (c >= W) continue;
    float y[4];  // [channel c + e] normalised
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = (v[4 * q + e] - st.x) * st.y;
    *reinterpret_cast<uint2*>(xhat + m * W + c) =
        make_uint2(dev::MmaOp<__half>::pack(y[0], y[1]), dev::MmaOp<__half>::pack(y[2], y[3]));
    if (xhat_bf)
      *reinterpret_cast<uint2*>(xhat_bf + m * W + c) =
          make_uint2(dev::MmaOp<__nv_bfloat16>::pack(y[0], y[1]), dev::MmaOp<__nv_bfloat16>::pack(y[2], y[3]));
  }
  if (mean && lane == 0) mean[m] = st.x, rstd[m] = st.y;
}

__global__ void __launch_bounds__(kRowWarps * 32)
    ln_rows_backward_kernel(const __nv_bfloat16* dxhat, PairRef z, Dims d, const float* mean,
                            const float* rstd, PairRef dz) {
  constexpr auto kQ = RowLayout::kQuads;
  const int lane = threadIdx.x & 31;
  const int64_t m = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (m >= d.M()) return;
  const auto* src = static_cast<const __nv_bfloat16*>(z.ptr) + pair_offset(z, m, d.N);
  auto* dst = static_cast<__nv_bfloat16*>(dz.ptr) + pair_offset(dz, m, d.N);
  const bool src_vec = reinterpret_cast<uintptr_t>(src) % 8 == 0, dst_vec = reinterpret_cast<uintptr_t>(dst) % 8 == 0;
  const int W = static_cast<int>(d.C);
  const float mu = mean[m], rs = rstd[m];
  float xh[kMaxPerLane], g[kMaxPerLane];  // [value] channel channel_of<kQuads>(k, lane)
#pragma unroll
  for (int q = 0; q < kMaxPerLane / 4; ++q) {
    const int c = channel_of<kQ>(4 * q, lane);
    if (c < W) {
      load4(xh + 4 * q, src + c, src_vec);
      load4(g + 4 * q, dxhat + m * W + c, true);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      xh[4 * q + e] = c < W ? (xh[4 * q + e] - mu) * rs : 0.f;
      if (c >= W) g[4 * q + e] = 0.f;
    }
  }
  norm_backward<kQ>(g, xh, W, rs);
#pragma unroll
  for (int q = 0; q < kMaxPerLane / 4; ++q) {
    const int c = channel_of<kQ>(4 * q, lane);
    if (c >= W) continue;
    if (dst_vec) {
      *reinterpret_cast<uint2*>(dst + c) = make_uint2(dev::MmaOp<__nv_bfloat16>::pack(g[4 * q], g[4 * q + 1]),
                                                      dev::MmaOp<__nv_bfloat16>::pack(g[4 * q + 2], g[4 * q + 3]));
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[c + e] = __float2bfloat16_rn(g[4 * q + e]);
    }
  }
}

// Channel-major tiles: kColPixels consecutive pixels x Ch channels in shared memory as
// [channel][pixel] fp32 with a padded row (conflict-free for both walks).
constexpr int kColStride = kColPixels + 1;

// Offset of channel 0 of pixel m in a channel-major buffer (channel c adds c * plane).
__device__ __forceinline__ int64_t cm_base(const Dims& d, int64_t m) { return cm_offset(d, m, 0); }

__global__ void __launch_bounds__(kRowWarps * 32)
    ln_cm_forward_kernel(const __nv_bfloat16* x, Dims d, float eps, __half* xhat,
                         __nv_bfloat16* xhat_bf, float* mean, float* rstd) {
  extern __shared__ float tile[];  // [Ch][kColStride]
  const int64_t m0 = int64_t(blockIdx.x) * kColPixels;
  const int W = static_cast<int>(d.Ch), p = threadIdx.x % kColPixels;
  const int64_t m = m0 + p;
  const int64_t base = m < d.M() ? cm_base(d, m) : 0;
  for (int c = threadIdx.x / kColPixels; c < W; c += kRowWarps * 32 / kColPixels)
    tile[c * kColStride + p] = m < d.M() ? __bfloat162float(x[base + c * d.plane()]) : 0.f;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int q = warp; q < kColPixels; q += kRowWarps) {
    const int64_t mq = m0 + q;
    if (mq >= d.M()) break;
    float v[kMaxPerLane];
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) v[k] = k * 32 < W ? tile[(k * 32 + lane) * kColStride + q] : 0.f;
    normalize_row(v, W, eps, mq, lane, xhat, xhat_bf, mean, rstd);
  }
}

__global__ void __launch_bounds__(kRowWarps * 32)
    ln_cm_backward_kernel(const __nv_bfloat16* dxhat, const __nv_bfloat16* x, Dims d,
                          const float* mean, const float* rstd, __nv_bfloat16* dx) {
  extern __shared__ float tiles[];  // x then g: [Ch][kColStride] each
  const int W = static_cast<int>(d.Ch);
  float* xt = tiles;
  float* gt = tiles + W * kColStride;
  const int64_t m0 = int64_t(blockIdx.x) * kColPixels;
  const int p = threadIdx.x % kColPixels;
  const int64_t m = m0 + p;
  const int64_t base = m < d.M() ? cm_base(d, m) : 0;
  for (int c = threadIdx.x / kColPixels; c < W; c += kRowWarps * 32 / kColPixels)
    xt[c * kColStride + p] = m < d.M() ? __bfloat162float(x[base + c * d.plane()]) : 0.f;
  for (int i = threadIdx.x; i < W * kColPixels; i += kRowWarps * 32) {  // pixel-major reads
    const int q = i / W, c = i % W;
    gt[c * kColStride + q] = m0 + q < d.M() ? __bfloat162float(dxhat[(m0 + q) * W + c]) : 0.f;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int q = warp; q < kColPixels; q += kRowWarps) {
    const int64_t mq = m0 + q;
    if (mq >= d.M()) break;
    const float mu = mean[mq], rs = rstd[mq];
    float xh[kMaxPerLane], g[kMaxPerLane];
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const bool in = k * 32 < W;
      xh[k] = in ? (xt[(k * 32 + lane) * kColStride + q] - mu) * rs : 0.f;
      g[k] = in ? gt[(k * 32 + lane) * kColStride + q] : 0.f;
    }
    norm_backward(g, xh, W, rs);
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k)
      if (k * 32 < W) gt[(k * 32 + lane) * kColStride + q] = g[k];
  }
  __syncthreads();
  if (m >= d.M()) return;
  const bool row_end = m % d.N == d.N - 1;  // also zero the pads of this row
  for (int c = threadIdx.x / kColPixels; c < W; c += kRowWarps * 32 / kColPixels) {
    __nv_bfloat16* o = dx + base + c * d.plane();
    o[0] = __float2bfloat16_rn(gt[c * kColStride + p]);
    if (row_end)
      for (int64_t j = 1; j < d.Np - d.N + 1; ++j) o[j] = __float2bfloat16_rn(0.f);
  }
}

unsigned row_blocks(const Dims& d) { return static_cast<unsigned>((d.M() + kRowWarps - 1) / kRowWarps); }
unsigned col_blocks(const Dims& d) { return static_cast<unsigned>((d.M() + kColPixels - 1) / kColPixels); }

template <class K>
cudaError_t allow_smem(K* kernel, size_t bytes) {
  return bytes > 48 * 1024
             ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))
             : cudaSuccess;
}

}  // namespace

cudaError_t ln_rows_forward(const Problem& p, void* xhat, void* xhat_bf, float* mean,
                            float* rstd, cudaStream_t s) {
  ln_rows_forward_kernel<<<row_blocks(p.d), kRowWarps * 32, 0, s>>>(
      p.z, p.d, p.eps, static_cast<__half*>(xhat), static_cast<__nv_bfloat16*>(xhat_bf), mean, rstd);
  return cudaGetLastError();
}

cudaError_t ln_channel_major_forward(const Problem& p, const void* x, void* xhat, void* xhat_bf,
                                     float* mean, float* rstd, cudaStream_t s) {
  const size_t smem = p.d.Ch * kColStride * sizeof(float);
  if (auto e = allow_smem(ln_cm_forward_kernel, smem); e != cudaSuccess) return e;
  ln_cm_forward_kernel<<<col_blocks(p.d), kRowWarps * 32, smem, s>>>(
      static_cast<const __nv_bfloat16*>(x), p.d, p.eps, static_cast<__half*>(xhat),
      static_cast<__nv_bfloat16*>(xhat_bf), mean, rstd);
  return cudaGetLastError();
}

cudaError_t ln_rows_backward(const Problem& p, const void* dxhat, const float* mean,
                             const float* rstd, cudaStream_t s) {
  ln_rows_backward_kernel<<<row_blocks(p.d), kRowWarps * 32, 0, s>>>(
      static_cast<const __nv_bfloat16*>(dxhat), p.z, p.d, mean, rstd, p.dz);
  return cudaGetLastError();
}

cudaError_t ln_channel_major_backward(const Problem& p, const void* dxhat, const void* x,
                                      const float* mean, const float* rstd, void* dx,
                                      cudaStream_t s) {
  const size_t smem = 2 * p.d.Ch * kColStride * sizeof(float);
  if (auto e = allow_smem(ln_cm_backward_kernel, smem); e != cudaSuccess) return e;
  ln_cm_backward_kernel<<<col_blocks(p.d), kRowWarps * 32, smem, s>>>(
      static_cast<const __nv_bfloat16*>(dxhat), static_cast<const __nv_bfloat16*>(x), p.d, mean,
      rstd, static_cast<__nv_bfloat16*>(dx));
  return cudaGetLastError();
}

}  // namespace tpf::trimul
