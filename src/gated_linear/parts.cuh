// Parts of the fused gated output projection (gated_linear/forward.cu, backward.cu).
//
// A block is one warpgroup walking 64-row tiles of a persistent grid, two blocks a
// multiprocessor (shared memory bounds it), so that one's arithmetic runs under the other's
// memory traffic. Its weight tile stays in shared memory for the whole walk. g and o come into
// shared memory by cp.async; the pair-tensor side (x, scale and out; dz, scale and du) runs in
// row passes of 16-byte pieces, as the residual kernels do, through a staged bf16 tile. Each
// thread reads or writes the staged tiles at its fragment positions: the A fragments of the
// m64n128k16 products (A from registers) and the positions of their accumulators. Global
// accesses at those positions would touch 8 rows an instruction, which the memory pipeline
// serves 8 times slower than whole rows.
//
// Fragment positions (warp w, g = lane / 4, t = lane % 4), rows row0 = 16 w + g and row0 + 8:
//   A fragment of k16 step kk: a[2 hh + rr] holds (row0 + 8 rr, 16 kk + 8 hh + 2 t, + 1)
//   accumulator of n8 tile i:  acc[4 i + 2 rr + e] holds (row0 + 8 rr, 8 i + 2 t + e)
#pragma once
#include <cuda_bf16.h>

#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/wgmma.cuh"
#include "gated_linear/kernels.h"
#include "residual/vec8.cuh"

namespace tpf::gated {

using bf16 = __nv_bfloat16;

constexpr int kTileRows = 64;  // rows of a tile: one warpgroup
constexpr int kThreads = 128;
constexpr int kBlocksPerSm = 2;  // 84 KB of shared memory each: the weight and three staged tiles
constexpr int kSteps = kK / 16;                   // k16 steps of a product (K = N = 128)
constexpr int kTiles8 = kN / 8;                   // n8 accumulator tiles
constexpr uint32_t kHalfBytes = 128 * 64 * 2;     // one [128][64] half of the weight tile
constexpr uint32_t kWeightBytes = 2 * kHalfBytes;
constexpr int kVec = residual::kVec;              // channels of a row pass's piece
static_assert(kK == kN, "the backward's product runs over N with K outputs: one tile shape");

struct Frag {
  int row0;  // first of this thread's two rows in the tile
  int col;   // 2 t: this thread's column within an 8-column group
  __device__ Frag() : row0(16 * (threadIdx.x / 32) + (threadIdx.x % 32) / 4), col(2 * (threadIdx.x % 4)) {}
};

__device__ __forceinline__ float2 load2(const bf16* p) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p)); }
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<uint32_t*>(p) = dev::MmaOp<bf16>::pack(a, b);
}
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The weight W [N][K] as the K-major B tile [2 halves][128][64] (128B-swizzled): element (n, k)
// is W[n][k], or W[k][n] when `transposed` (the backward's B = W, its K over W's rows).
// Coalesced reads of W; once a block, so the scattered 2-byte stores do not matter.
__device__ __forceinline__ void load_weight(bf16* tile, const bf16* w, bool transposed) {
  for (int e = threadIdx.x; e < kN * kK; e += kThreads) {
    const int r = e / kK, c = e % kK;  // W[r][c]
    *dev::halves_at<128>(tile, transposed ? c : r, transposed ? r : c) = w[e];
  }
  dev::fence_proxy_async();  // the generic-proxy stores, visible to wgmma
  __syncthreads();
}

// acc = A B^T over K = 128 for the warpgroup's 64 rows: A from registers, B the weight tile.
__device__ __forceinline__ void project(float (&acc)[64], const uint32_t (&a)[kSteps][4], uint32_t tile) {
  dev::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    dev::WgmmaN128RS<0>::run(acc, a[kk], dev::wgmma_desc(tile + (kk / 4) * kHalfBytes + 32 * (kk % 4), 16, 1024),
                             kk > 0);
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(acc);
}

// One operand's rows [m0, m0 + 64) of a tile in shared memory: rows of kBytes, each padded by
// kBytes / 16 so that a fragment access (8 rows x 4 lanes) touches 32 distinct banks.
template <int kBytes>
struct Staged {
  static constexpr int kPitch = kBytes + kBytes / 16;  // bytes from one row to the next
  static constexpr uint32_t kSize = kTileRows * kPitch;
  uint8_t* base;
  // cp.async copies of the rows from src (row stride ld_bytes); rows past the end are zeros.
  __device__ __forceinline__ void issue(const void* src, int64_t ld_bytes, int64_t m0, int64_t rows) const {
    constexpr int kChunks = kBytes / 16;
    for (int e = threadIdx.x; e < kTileRows * kChunks; e += kThreads) {
      const int r = e / kChunks, ch = e % kChunks;
      const bool in = m0 + r < rows;
      const char* p = static_cast<const char*>(src) + (in ? (m0 + r) * ld_bytes + 16 * ch : 0);
      dev::cp_async_16(base + r * kPitch + 16 * ch, p, in);
    }
  }
  template <class T>
  __device__ __forceinline__ T* row(int r) const { return reinterpret_cast<T*>(base + r * kPitch); }
  // The rows back to dst (row stride ld_bytes) in 16-byte pieces, a warp's store covering whole
  // rows; rows past the end are not written.
  __device__ __forceinline__ void flush(void* dst, int64_t ld_bytes, int64_t m0, int64_t rows) const {
    constexpr int kChunks = kBytes / 16;
    for (int e = threadIdx.x; e < kTileRows * kChunks; e += kThreads) {
      const int r = e / kChunks, ch = e % kChunks;
      if (m0 + r < rows)
        *reinterpret_cast<uint4*>(static_cast<char*>(dst) + (m0 + r) * ld_bytes + 16 * ch) =
            *reinterpret_cast<const uint4*>(base + r * kPitch + 16 * ch);
    }
  }
};

using Rows16 = Staged<kK * 2>;  // bf16 [64][128]: g, o, and the pair-side tile

// The row passes: a thread's pieces of kVec channels of a tile, piece k at tile row r from
// channel c, a warp covering whole rows; their loads go kBatch pieces at a time, so that two
// blocks a multiprocessor keep enough bytes in flight.
constexpr int kPieces = kN / kVec;                           // pieces of a row
constexpr int kPassPieces = kTileRows * kPieces / kThreads;  // a thread's pieces of a tile
constexpr int kBatch = 4;
struct Piece {
  int r, c;
  __device__ explicit Piece(int k) : r((threadIdx.x + k * kThreads) / kPieces), c(kVec * ((threadIdx.x + k * kThreads) % kPieces)) {}
};

// Waits for every copy group but the newest `kPending`, then for the whole block (one
// warpgroup), so that each thread reads what the others' copies brought.
template <int kPending>
__device__ __forceinline__ void staged_ready() {
  dev::cp_async_wait<kPending>();
  __syncthreads();
}

// The persistent grid: two blocks a multiprocessor, at most one a tile; the dynamic shared
// memory opted in; or the error of the queries.
template <class Kernel>
cudaError_t grid_for(Kernel k, int64_t rows, uint32_t smem_bytes, unsigned* blocks) {
  int device = 0, sms = 0;
  cudaError_t e;
  if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return e;
  if ((e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes)) != cudaSuccess) return e;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows, most = int64_t(sms) * kBlocksPerSm;
  *blocks = static_cast<unsigned>(tiles < most ? tiles : most);
  return cudaSuccess;
}

}  // namespace tpf::gated
