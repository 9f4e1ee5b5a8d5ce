// Shared-memory tile layout and loads used by the attention kernels.
//
// A tile is ROWS x D elements of 16-bit type, row-major, each row cut into D/8 chunks of 16
// bytes. Chunk c of row r is stored at chunk position c ^ f(r): with rows of 32, 64 or >=128
// bytes, eight consecutive rows would otherwise hit the same banks in one ldmatrix phase.
#pragma once
#include <cstdint>

#include "attention/kernel_args.h"
#include "common/mma.cuh"

namespace tpf::attn {

template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  if constexpr (kChunks >= 8) {
    return chunk ^ (row & 7);
  } else {
    return chunk ^ ((row / (8 / kChunks)) % kChunks);
  }
}

// Address of element (row, 8 * chunk) of a swizzled tile.
template <int D, class T>
__device__ __forceinline__ T* tile_at(T* tile, int row, int chunk) {
  return tile + row * D + swizzle<D>(row, chunk) * 8;
}

// Asynchronously copy rows [row0, row0 + ROWS) of one (b, s, h) slice into a swizzled tile;
// rows at or past n_rows are zero-filled.
template <int D, int ROWS, int THREADS, class T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* slice, int64_t row_stride,
                                                int row0, int n_rows, int tid) {
  constexpr int kChunks = D / 8;
  for (int i = tid; i < ROWS * kChunks; i += THREADS) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < n_rows;
    const T* src = valid ? slice + (row0 + r) * row_stride + c * 8 : slice;
    dev::cp_async_16(tile_at<D>(tile, r, c), src, valid);
  }
}

template <class T>
__device__ __forceinline__ const T* slice_ptr(const Bshnd& t, int b, int s, int h) {
  return static_cast<const T*>(t.ptr) + b * t.sb + s * t.ss + h * t.sh;
}
template <class T>
__device__ __forceinline__ T* slice_ptr_mut(const Bshnd& t, int b, int s, int h) {
  return static_cast<T*>(t.ptr) + b * t.sb + s * t.ss + h * t.sh;
}

// bias[b,0,h,q,k] * log2(e) as fp32; 0 outside [0,N) (such entries are masked anyway).
template <class T>
__device__ __forceinline__ float load_bias_log2(const BiasRef& bias, int64_t base, int q, int k,
                                                int n) {
  if (q >= n || k >= n) return 0.f;
  const int64_t off = base + q * bias.sq + k * bias.sk;
  const float x = bias.fp32 ? __ldg(static_cast<const float*>(bias.ptr) + off)
                            : dev::to_float(static_cast<const T*>(bias.ptr)[off]);
  return x * 1.4426950408889634f;
}

// Whether key k of slice (b, s) is attended (in range and not masked out).
__device__ __forceinline__ bool key_attended(const MaskRef& m, int b, int s, int k, int n) {
  if (k >= n) return false;
  return m.ptr == nullptr || m.ptr[b * m.sb + s * m.ss + k * m.sk] != 0;
}

}  // namespace tpf::attn
