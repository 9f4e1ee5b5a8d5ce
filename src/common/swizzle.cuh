// Shared-memory tile layout shared by every tensor-core kernel.
//
// A tile is ROWS x W elements of a 16-bit type, row-major, each row cut into W/8 chunks of 16
// bytes. Chunk c of row r is stored at chunk position c ^ f(r): with rows of 32, 64 or >=128
// bytes, the eight rows one ldmatrix phase reads would otherwise hit the same banks.
#pragma once

namespace tpf::dev {

template <int W>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  constexpr int kChunks = W / 8;  // 16-byte chunks per row
  if constexpr (kChunks >= 8) {
    return chunk ^ (row & 7);
  } else {
    return chunk ^ ((row / (8 / kChunks)) % kChunks);
  }
}

// Offset (in elements) of element (row, 8 * chunk) of a swizzled tile with rows of W elements.
template <int W>
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * W + swizzle<W>(row, chunk) * 8;
}

// Address of element (row, 8 * chunk) of a swizzled tile with rows of W elements.
template <int W, class T>
__device__ __forceinline__ T* tile_at(T* tile, int row, int chunk) {
  return tile + tile_offset<W>(row, chunk);
}

// Element (row, col) of a tile of kRows rows cut along its columns into halves of 64 (128-byte
// swizzled rows, each half kRows x 64): the K-major wgmma operand whose K exceeds one swizzle row.
template <int kRows, class T>
__device__ __forceinline__ T* halves_at(T* tile, int row, int col) {
  return tile_at<64>(tile + (col / 64) * kRows * 64, row, (col % 64) / 8) + col % 8;
}

}  // namespace tpf::dev
