// Shared-memory tile loads used by the attention kernels (tile layout: common/swizzle.cuh).
#pragma once
#include <cstdint>

#include "attention/kernel_args.h"
#include "common/mma.cuh"
#include "common/swizzle.cuh"

namespace tpf::attn {

using dev::swizzle;
using dev::tile_at;

// Copies ROWS x D tiles of a (b, s, h) slice into swizzled shared tiles with cp.async. The
// chunks each thread copies are fixed, so their rows, columns and shared offsets are computed
// once (constructor) and every tile costs one address computation and one LDGSTS per chunk.
// Rows at or past n_rows are zero-filled.
template <int D, int ROWS, int THREADS>
struct TileCopier {
  static constexpr unsigned kChunks = D / 8, kTotal = ROWS * kChunks;  // 16-byte chunks
  static constexpr int kIters = (kTotal + THREADS - 1) / THREADS;
  int row[kIters];       // tile row of each chunk (ROWS marks "none" when THREADS doesn't divide)
  int col[kIters];       // its first element
  uint32_t dst[kIters];  // its byte offset in the tile

  __device__ __forceinline__ explicit TileCopier(int tid) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const unsigned i = tid + it * THREADS;
      const bool has = kTotal % THREADS == 0 || i < kTotal;
      row[it] = has ? static_cast<int>(i / kChunks) : ROWS;
      col[it] = has ? static_cast<int>(i % kChunks) * 8 : 0;
      dst[it] = has ? 2 * (row[it] * D + swizzle<D>(row[it], col[it] / 8) * 8) : 0;
    }
  }

  template <class T>
  __device__ __forceinline__ void copy(T* tile, const T* slice, int64_t row_stride, int row0,
                                       int n_rows) const {
    const uint32_t base = dev::smem_addr(tile);
    const int stride = static_cast<int>(row_stride);  // in-slice offsets fit 31 bits (host check)
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (kTotal % THREADS != 0 && row[it] == ROWS) break;
      const bool valid = row0 + row[it] < n_rows;
      const T* src = slice + (valid ? (row0 + row[it]) * stride + col[it] : 0);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(base + dst[it]),
                   "l"(src), "r"(valid ? 16 : 0));
    }
  }
};

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

// Loads bias tiles (query rows x key columns) of one (b, h). Vector path (key stride 1, rows
// 16-byte aligned): 16-byte cp.async chunks with fixed per-thread geometry, zero-filled past N.
// Other strides: scalar loads.
template <class BiasT, int ROWS, int COLS, int THREADS>
struct BiasCopier {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  static constexpr int kEsize = sizeof(BiasT), kPerChunk = 16 / kEsize;
  static constexpr unsigned kChunks = COLS / kPerChunk, kTotal = ROWS * kChunks;
  static constexpr int kIters = (kTotal + THREADS - 1) / THREADS;
  int row[kIters], col[kIters];
  uint32_t dst[kIters];

  __device__ __forceinline__ explicit BiasCopier(int tid) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const unsigned i = tid + it * THREADS;
      const bool has = kTotal % THREADS == 0 || i < kTotal;
      row[it] = has ? static_cast<int>(i / kChunks) : ROWS;
      col[it] = has ? static_cast<int>(i % kChunks) * kPerChunk : 0;
      dst[it] = has ? row[it] * Tile::kRowBytes + col[it] * kEsize : 0;
    }
  }

  // Rows [q0, q0+ROWS) x keys [k0, k0+COLS); `g` points at bias[b,0,h,0,0].
  __device__ __forceinline__ void copy(uint8_t* tile, const BiasRef& bias, const BiasT* g, int q0,
                                       int k0, int n, int tid) const {
    if (bias.vec16) {
      const uint32_t base = dev::smem_addr(tile);
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        if (kTotal % THREADS != 0 && row[it] == ROWS) break;
        const int q = q0 + row[it], k = k0 + col[it];
        const int valid = (q < n && k < n) ? min(16, (n - k) * kEsize) : 0;
        const BiasT* src = g + (valid ? q * static_cast<int>(bias.sq) + k : 0);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(base + dst[it]),
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
};

// Bias (query row r, key column c) of a tile.
template <class BiasT, int ROWS, int COLS>
__device__ __forceinline__ float bias_at(const uint8_t* tile, int r, int c) {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  return dev::to_float(reinterpret_cast<const BiasT*>(tile + r * Tile::kRowBytes)[c]);
}

// Two adjacent keys (c, c+1; c even) of one query row, in one shared-memory load.
template <class BiasT, int ROWS, int COLS>
__device__ __forceinline__ float2 bias_pair_at(const uint8_t* tile, int r, int c) {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  const uint8_t* p = tile + r * Tile::kRowBytes + c * int(sizeof(BiasT));
  if constexpr (sizeof(BiasT) == 4) {
    return *reinterpret_cast<const float2*>(p);
  } else {
    return dev::pair_to_float2<BiasT>(*reinterpret_cast<const uint32_t*>(p));
  }
}

// 16-bit bias pairs of two 8 x 8 blocks' worth of an MMA C fragment, in one ldmatrix.x4
// instead of four shared loads: the fragment of 16 rows (row0 + g, + 8) x 16 columns (c0 + 2t,
// + 1 and the next n8 tile) of the tile (kTrans = false: rows are queries, columns keys, as the
// forward's S), or of its transpose (kTrans = true: rows are keys, columns queries, the
// backward's S^T). b[0], b[1]: rows g, g + 8 of the first n8 tile; b[2], b[3]: of the second.
// The padded rows (16 bytes past 16-byte multiples) put the 8 rows each matrix reads in
// distinct banks.
template <class BiasT, int ROWS, int COLS, bool kTrans>
__device__ __forceinline__ void bias_pairs_x4(uint32_t (&b)[4], const uint8_t* tile, int row0, int c0, int lane) {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  static_assert(sizeof(BiasT) == 2 && Tile::kRowBytes % 16 == 0, "16-bit rows of 16-byte chunks");
  const int mx = lane >> 3, j = lane & 7;
  const int fr = row0 + 8 * (mx & 1), fc = c0 + 8 * (mx >> 1);  // this lane's matrix: fragment rows, columns
  if constexpr (kTrans) {  // matrix rows are the fragment's columns (queries), 16 bytes of 8 keys
    dev::ldmatrix_x4_trans(b, tile + (fc + j) * Tile::kRowBytes + fr * 2);
  } else {
    dev::ldmatrix_x4(b, tile + (fr + j) * Tile::kRowBytes + fc * 2);
  }
}

// Whether key k of slice (b, s) is attended (in range and not masked out).
__device__ __forceinline__ bool key_attended(const MaskRef& m, int b, int s, int k, int n) {
  if (k >= n) return false;
  return m.ptr == nullptr || m.ptr[b * m.sb + s * m.ss + k * m.sk] != 0;
}

}  // namespace tpf::attn
