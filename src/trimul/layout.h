// Shapes, tensor references and workspace layout of the multiplicative-update kernels
// (host and device).
//
// Two layouts of per-pair data:
//   pixel-major    [B*N*N][W]           row m = (b*N + i)*N + j, channels contiguous
//   channel-major  [B][Ch][N][Np]       one N x N matrix per (b, channel) for the triangle
//                                       product; rows padded to Np = N rounded up to 8 so every
//                                       row starts 16-byte aligned. Pads are kept zero (they
//                                       enter the K sums of the products).
#pragma once
#include <cstddef>
#include <cstdint>

#include "residual/kernels.h"
#include "turbopairformer/tensor.h"

#if defined(__CUDACC__)
#define TPF_HD __host__ __device__
#else
#define TPF_HD
#endif

namespace tpf::trimul {

struct Dims {
  int64_t B, N, Np, C, Ch;
  TPF_HD int64_t M() const { return B * N * N; }      // pixels
  TPF_HD int64_t plane() const { return N * Np; }     // one channel-major matrix
  TPF_HD int64_t cm_elems() const { return B * Ch * plane(); }
  TPF_HD int64_t proj_cols() const { return 4 * Ch + C; }  // [a/b projections and gates; out gate]
  TPF_HD int64_t dlin_cols() const { return proj_cols() + 4 * Ch; }  // + the a/b columns' low parts
};

// Float index of (channel c, pixel r) in a prefetched da/db tile [channels][kPixels] fp32: the
// 16-byte (4-pixel) chunk k of channel c's row at k ^ 2 (c % 4), so that a warp's reads (4
// channels x 8 pixels) hit the 32 banks once (the projection backward's epilogue, kPixels = 128;
// the fused tail's consumers, 64).
template <int kPixels>
TPF_HD inline int da_tile_index(int c, int r) {
  return c * kPixels + (((r >> 2) ^ (2 * (c & 3))) << 2) + (r & 3);
}

// A pixel-major tensor with arbitrary b, i, j strides (channel stride 1): z, out, dout, dz.
struct PairRef {
  void* ptr;
  int64_t sb, si, sj;
};

// The forward's residual update around the op (ptr nullptr: none): out = residual + scale *
// update, the update rounded to bf16 first. residual and out are contiguous [M][C] rows in fp32
// (f32) or bf16; the scale is bf16 through its strides (scale.p nullptr: 1).
struct ResidualRef {
  const void* ptr;
  bool f32;
  residual::Scale scale;
};

// The optional pair mask [B, N, N] of any dtype (ptr == nullptr: all ones).
struct MaskRef {
  const void* ptr;
  int dtype;
  int64_t sb, si, sj;
};

// A weight matrix [rows][cols] (or a vector: rows = 1) in bf16 or fp32 with row stride s0.
struct WeightRef {
  const void* ptr;  // nullptr: absent (an optional bias reads as zero)
  int dtype;
  int64_t s0;
};

#if defined(__CUDACC__)
__device__ __forceinline__ float load_any(const void* p, int dtype, int64_t off) {
  switch (static_cast<DType>(dtype)) {
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
    case DType::kFP16: return __half2float(static_cast<const __half*>(p)[off]);
    case DType::kFP32: return static_cast<const float*>(p)[off];
    case DType::kFP64: return static_cast<float>(static_cast<const double*>(p)[off]);
    default: return static_cast<const uint8_t*>(p)[off] ? 1.f : 0.f;  // bool
  }
}
// q = a / b, r = a % b for a, b >= 0: 32-bit arithmetic when both fit (every problem up to
// B N^2 < 2^32 pixels), where 64-bit division would cost several times as many instructions.
__device__ __forceinline__ void divmod(int64_t a, int64_t b, int64_t& q, int64_t& r) {
  if (((a | b) >> 32) == 0) {
    const uint32_t q32 = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    q = q32, r = static_cast<uint32_t>(a) - q32 * static_cast<uint32_t>(b);
  } else {
    q = a / b, r = a - q * b;
  }
}
// Pixel m as (batch, row, column).
struct PixelIndex {
  int64_t b, i, j;
};
__device__ __forceinline__ PixelIndex pixel_index(int64_t m, int64_t N) {
  PixelIndex p;
  int64_t ij;
  divmod(m, N * N, p.b, ij);
  divmod(ij, N, p.i, p.j);
  return p;
}
__device__ __forceinline__ float weight_at(const WeightRef& w, int64_t r, int64_t c) {
  return w.ptr ? load_any(w.ptr, w.dtype, r * w.s0 + c) : 0.f;
}
__device__ __forceinline__ float mask_at(const MaskRef& m, int64_t pixel, int64_t N) {
  if (!m.ptr) return 1.f;
  const PixelIndex q = pixel_index(pixel, N);
  return load_any(m.ptr, m.dtype, q.b * m.sb + q.i * m.si + q.j * m.sj);
}
// Offset of pixel m's channel 0 in a strided pixel-major tensor.
__device__ __forceinline__ int64_t pair_offset(const PairRef& t, int64_t m, int64_t N) {
  const PixelIndex q = pixel_index(m, N);
  return q.b * t.sb + q.i * t.si + q.j * t.sj;
}
// Offset of (pixel m, channel c) in a channel-major buffer.
__device__ __forceinline__ int64_t cm_offset(const Dims& d, int64_t m, int64_t c) {
  const PixelIndex q = pixel_index(m, d.N);
  return ((q.b * d.Ch + c) * d.N + q.i) * d.Np + q.j;
}
#endif

}  // namespace tpf::trimul
