// Parts of the fused gated output projection (gated_linear/forward.cu, backward.cu).
//
// A block is one warpgroup walking 64-row tiles of a persistent grid (several blocks a
// multiprocessor, so that one's loads run under another's products). Its weight tile stays in
// shared memory for the whole walk. Every operand row comes from global memory straight into
// this thread's fragment positions: the A fragments of the m64n128k16 products (A from
// registers) and the positions of their accumulators, so no tile is staged in shared memory.
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

namespace tpf::gated {

using bf16 = __nv_bfloat16;

constexpr int kTileRows = 64;  // rows of a tile: one warpgroup
constexpr int kThreads = 128;
// Blocks a multiprocessor, the occupancy the register budgets allow without spilling: the
// forward holds the A fragments and the accumulators (<= 128 registers), the backward also the
// gate's g and o rows for the epilogue (<= 168).
constexpr int kForwardBlocks = 4, kBackwardBlocks = 3;
constexpr int kSteps = kK / 16;                   // k16 steps of a product (K = N = 128)
constexpr int kTiles8 = kN / 8;                   // n8 accumulator tiles
constexpr uint32_t kHalfBytes = 128 * 64 * 2;     // one [128][64] half of the weight tile
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

// The scale's row (b, i, j) of row r, or null where there is no scale.
__device__ __forceinline__ const bf16* scale_row(const Scale& s, const Rows& n, int64_t r) {
  if (!s.p) return nullptr;
  const int64_t j = r % n.J, i = (r / n.J) % n.I, b = r / (n.J * n.I);
  return s.p + b * s.s[0] + i * s.s[1] + j * s.s[2];
}
// The scale of columns c, c + 1 of a row from scale_row (1 without a scale).
__device__ __forceinline__ float2 scale_at(const bf16* row, const Scale& s, int c) {
  if (!row) return make_float2(1.f, 1.f);
  if (s.s[3] == 1) return load2(row + c);
  const float v = __bfloat162float(*row);
  return make_float2(v, v);
}

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

// The persistent grid: as many blocks as fit on the device (kernel's occupancy), at most one a
// tile; or the error of the queries.
template <class Kernel>
cudaError_t grid_for(Kernel k, int64_t rows, unsigned* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e;
  if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return e;
  if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, 0)) != cudaSuccess) return e;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows, most = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  *blocks = static_cast<unsigned>(tiles < most ? tiles : most);
  return cudaSuccess;
}

}  // namespace tpf::gated
