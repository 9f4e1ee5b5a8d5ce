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
// rows at or past n_rows are zero-filled. Trip count and divisors are compile-time constants
// (powers of two), so the loop unrolls into a few address computations and LDGSTS.
template <int D, int ROWS, int THREADS, class T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* slice, int64_t row_stride,
                                                int row0, int n_rows, int tid) {
  constexpr unsigned kChunks = D / 8, kTotal = ROWS * kChunks;
  constexpr int kIters = (kTotal + THREADS - 1) / THREADS;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const unsigned i = tid + it * THREADS;
    if (kTotal % THREADS != 0 && i >= kTotal) break;
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

// A bias tile in shared memory: ROWS queries x COLS keys in the bias dtype BiasT (16-bit or
// fp32), row-major, each row padded by 16 bytes so that the quads of lanes reading pairs of keys
// of eight different rows fall in distinct banks.
template <class BiasT, int ROWS, int COLS>
struct BiasTile {
  static constexpr int kRowBytes = COLS * int(sizeof(BiasT)) + 16;
  static constexpr int kBytes = ROWS * kRowBytes;
};

// Loads the bias tile rows [q0, q0+ROWS) x keys [k0, k0+COLS) of (b, h) into `tile`.
// Vector path: 16-byte cp.async chunks, zero-filled past N. Other strides: scalar loads.
template <class BiasT, int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_bias_tile(uint8_t* tile, const BiasRef& bias, int64_t base,
                                               int q0, int k0, int n, int tid) {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  constexpr int kEsize = sizeof(BiasT);
  const BiasT* g = static_cast<const BiasT*>(bias.ptr) + base;
  if (bias.vec16) {
    constexpr unsigned kChunks = COLS * kEsize / 16, kTotal = ROWS * kChunks;  // per tile
    constexpr int kIters = (kTotal + THREADS - 1) / THREADS;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const unsigned i = tid + it * THREADS;
      if (kTotal % THREADS != 0 && i >= kTotal) break;
      const int r = i / kChunks, c = i % kChunks;
      const int q = q0 + r, k = k0 + c * (16 / kEsize);
      const int valid = (q < n && k < n) ? min(16, (n - k) * kEsize) : 0;
      const BiasT* src = valid ? g + q * bias.sq + k : g;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                       dev::smem_addr(tile + r * Tile::kRowBytes + c * 16)),
                   "l"(src), "r"(valid));
    }
  } else {
    for (int i = tid; i < ROWS * COLS; i += THREADS) {
      const int r = i / COLS, c = i % COLS, q = q0 + r, k = k0 + c;
      reinterpret_cast<BiasT*>(tile + r * Tile::kRowBytes)[c] =
          q < n && k < n ? g[q * bias.sq + k * bias.sk] : BiasT(0.f);
    }
  }
}

// Bias (query row r, key column c) of a tile, times log2(e).
template <class BiasT, int ROWS, int COLS>
__device__ __forceinline__ float bias_at(const uint8_t* tile, int r, int c) {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  return dev::to_float(reinterpret_cast<const BiasT*>(tile + r * Tile::kRowBytes)[c]) *
         1.4426950408889634f;
}

// Two adjacent keys (c, c+1; c even) of one query row, times log2(e).
template <class BiasT, int ROWS, int COLS>
__device__ __forceinline__ float2 bias_pair_at(const uint8_t* tile, int r, int c) {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  constexpr float kLog2e = 1.4426950408889634f;
  const BiasT* p = reinterpret_cast<const BiasT*>(tile + r * Tile::kRowBytes) + c;
  return make_float2(dev::to_float(p[0]) * kLog2e, dev::to_float(p[1]) * kLog2e);
}

// Whether key k of slice (b, s) is attended (in range and not masked out).
__device__ __forceinline__ bool key_attended(const MaskRef& m, int b, int s, int k, int n) {
  if (k >= n) return false;
  return m.ptr == nullptr || m.ptr[b * m.sb + s * m.ss + k * m.sk] != 0;
}

}  // namespace tpf::attn
