// Shared-memory tile loads used by the attention kernels (tile layout: common/swizzle.cuh).
#pragma once
#include <cstdint>

#include "attention/kernel_args.h"
#include "common/mma.cuh"
#include "common/swizzle.cuh"

namespace tpf::attn {

using dev::swizzle;
using dev::tile_at;

// Copies ROWS x D tiles of a (b, s, h) slice into swizzled shared tiles with cp.async. Thread
// tid copies the 16-byte column chunk tid % (D/8) of rows r0 + it * kRowStep: kRowStep is a
// multiple of the swizzle period (8 rows), so every chunk's shared offset is the thread's first
// one plus a constant, and the thread keeps two integers instead of per-chunk tables (which the
// compiler rematerialised in the loop under register pressure). Rows at or past n_rows are
// zero-filled: their copies read 0 bytes, so their (out-of-range) source addresses are never
// dereferenced and need no clamping.
template <int D, int ROWS, int THREADS>
struct TileCopier {
  static constexpr int kChunks = D / 8;                  // 16-byte chunks per row
  static constexpr int kRowStep = THREADS / kChunks;     // rows one pass of the block covers
  static constexpr int kIters = ROWS / kRowStep;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0 && kRowStep % 8 == 0,
                "whole rows per pass, a multiple of the swizzle period");
  int r0, c0;    // this thread's first tile row and its column (element)
  uint32_t dst;  // byte offset of its first chunk in the tile

  __device__ __forceinline__ explicit TileCopier(int tid)
      : r0(tid / kChunks), c0((tid % kChunks) * 8), dst(2 * (r0 * D + swizzle<D>(r0, c0 / 8) * 8)) {}

  // kWholeFast: a tile wholly in range takes a branch without per-chunk bounds (the forward,
  // where they were a third of the loop's integer instructions).
  template <bool kWholeFast = false, class T>
  __device__ __forceinline__ void copy(T* tile, const T* slice, int64_t row_stride, int row0,
                                       int n_rows) const {
    const uint32_t base = dev::smem_addr(tile) + dst;
    const int stride = static_cast<int>(row_stride);  // in-slice offsets fit 31 bits (host check)
    const int row = row0 + r0;
    const T* src = slice + row * stride + c0;
    if (kWholeFast && row0 + ROWS <= n_rows) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) dev::cp_async_16(base + it * kRowStep * D * 2, src + it * kRowStep * stride);
      return;
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      dev::cp_async_16(base + it * kRowStep * D * 2, src + it * kRowStep * stride, row + it * kRowStep < n_rows);
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
// 16-byte aligned): 16-byte cp.async chunks, thread tid taking column chunk tid % kChunks of rows
// r0 + it * kRowStep (fixed geometry, as TileCopier), zero-filled past N. Other strides: scalar
// loads.
template <class BiasT, int ROWS, int COLS, int THREADS>
struct BiasCopier {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  static constexpr int kEsize = sizeof(BiasT), kPerChunk = 16 / kEsize;
  static constexpr int kChunks = COLS / kPerChunk;  // per row
  static constexpr int kRowStep = THREADS / kChunks, kIters = ROWS / kRowStep;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "whole rows per pass");
  int r0, c0;  // this thread's first row and its column

  __device__ __forceinline__ explicit BiasCopier(int tid)
      : r0(tid / kChunks), c0((tid % kChunks) * kPerChunk) {}

  // Rows [q0, q0+ROWS) x keys [k0, k0+COLS); `g` points at bias[b,0,h,0,0]. kWholeFast: as
  // TileCopier's.
  template <bool kWholeFast = false>
  __device__ __forceinline__ void copy(uint8_t* tile, const BiasRef& bias, const BiasT* g, int q0,
                                       int k0, int n, int tid) const {
    if (bias.vec16) {
      const uint32_t base = dev::smem_addr(tile) + r0 * Tile::kRowBytes + c0 * kEsize;
      const int q = q0 + r0, k = k0 + c0, sq = static_cast<int>(bias.sq);
      const BiasT* src = g + q * sq + k;
      if (kWholeFast && q0 + ROWS <= n && k0 + COLS <= n) {
#pragma unroll
        for (int it = 0; it < kIters; ++it)
          dev::cp_async_16(base + it * kRowStep * Tile::kRowBytes, src + it * kRowStep * sq);
        return;
      }
      const int bytes = min(16, max(0, (n - k) * kEsize));  // of this column chunk, in range
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        dev::cp_async_16_part(base + it * kRowStep * Tile::kRowBytes, src + it * kRowStep * sq,
                              q + it * kRowStep < n ? bytes : 0);
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

// A 16 x 8 block of a 16-bit bias tile (16 query rows, 8 keys) as the A operand of the
// scaled-identity MMA (dev::scaled_identity_b): {x0, x1, x0, x1}, the block written twice along
// k, in one ldmatrix.x4 whose lanes 16-31 repeat the row addresses of lanes 0-15 (so the MMA's
// A quad needs no register moves). The padded tile rows put the 8 rows each matrix reads in
// distinct banks. A lane's byte offset for the block at rows row0.. and key 0 is computed once
// (offset); key c (a multiple of 8) adds 2 c bytes.
template <class BiasT, int ROWS, int COLS>
struct BiasDupA {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  static_assert(sizeof(BiasT) == 2 && Tile::kRowBytes % 16 == 0, "16-bit rows of 16-byte chunks");

  __device__ __forceinline__ static uint32_t offset(int row0, int lane) {
    return (row0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * Tile::kRowBytes;
  }
  __device__ __forceinline__ static void load(uint32_t (&a)[4], uint32_t addr) { dev::ldmatrix_x4(a, addr); }
};

// A bias tile as TMA writes it with the 128-byte swizzle: parts of 128 bytes of keys (64 keys
// of a 16-bit bias, 32 of an fp32 one), each [ROWS][128 bytes] with 16-byte chunk c of row r at
// chunk c ^ (r % 8) (the pattern's 1024-byte period: parts start on it), so rows need no padding
// against bank conflicts. A 16-bit tile's 16 x 8 blocks load as BiasDupA's: the lane's row as
// there, the chunk XORed with row % 8, which is lane % 8 for blocks starting on a multiple of 8
// rows. An fp32 tile is read as key pairs (pair_offset).
template <int ROWS, int COLS, int kElemBytes = 2>
struct BiasSwz128 {
  static constexpr int kPartKeys = 128 / kElemBytes;
  static constexpr int kPartBytes = ROWS * 128;
  static constexpr int kBytes = COLS / kPartKeys * kPartBytes;
  static_assert(COLS % kPartKeys == 0 && ROWS % 8 == 0, "whole 128-byte parts of whole swizzle periods");
  __device__ __forceinline__ static uint32_t row_offset(int row0, int lane) {
    return (row0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * 128;
  }
  // 16-bit: keys 8 nt .. 8 nt + 7 of the lane's row, for xor = (lane % 8) * 16.
  __device__ __forceinline__ static uint32_t chunk_offset(int nt, uint32_t xor_bytes) {
    static_assert(kElemBytes == 2, "an n8 block is one 16-byte chunk");
    return (nt / 8) * kPartBytes + (((nt % 8) * 16) ^ xor_bytes);
  }
  // fp32: keys c, c + 1 (c even) of row r.
  __device__ __forceinline__ static uint32_t pair_offset(int r, int c) {
    static_assert(kElemBytes == 4, "fp32 pairs");
    const int part = c / kPartKeys, in_part = c % kPartKeys;
    return part * kPartBytes + r * 128 + (((in_part / 4) ^ (r % 8)) * 16) + (in_part % 4) * 4;
  }
};

// 16-bit bias pairs of S^T (rows keys, columns queries: the tile read transposed) for two
// n8 tiles of an MMA C fragment, in one ldmatrix.x4.trans instead of eight 2-byte loads:
// b[0], b[1]: rows g, g + 8 of the first n8 tile, b[2], b[3]: of the second. The padded tile rows
// (16 bytes past 16-byte multiples) put the 8 rows each matrix reads in distinct banks. A lane's
// byte offset for the fragment's first column is computed once (offset); column c adds
// kColStep * c.
template <class BiasT, int ROWS, int COLS>
struct BiasX4Trans {
  using Tile = BiasTile<BiasT, ROWS, COLS>;
  static constexpr int kColStep = Tile::kRowBytes;  // a fragment column is a tile row (query)

  // row0: the fragment's first row (key).
  __device__ __forceinline__ static uint32_t offset(int row0, int lane) {
    const int mx = lane >> 3, j = lane & 7;  // this lane's matrix, and its row in it
    const int fr = row0 + 8 * (mx & 1), fc = 8 * (mx >> 1);  // the matrix's fragment rows, columns
    return (fc + j) * Tile::kRowBytes + fr * 2;
  }
  __device__ __forceinline__ static void load(uint32_t (&b)[4], uint32_t addr) {
    static_assert(sizeof(BiasT) == 2 && Tile::kRowBytes % 16 == 0, "16-bit rows of 16-byte chunks");
    dev::ldmatrix_x4_trans(b, addr);
  }
};

// Whether key k of slice (b, s) is attended (in range and not masked out).
__device__ __forceinline__ bool key_attended(const MaskRef& m, int b, int s, int k, int n) {
  if (k >= n) return false;
  return m.ptr == nullptr || m.ptr[b * m.sb + s * m.ss + k * m.sk] != 0;
}

}  // namespace tpf::attn
