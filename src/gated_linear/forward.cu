// The fused gated output projection on Hopper (sm_90a). A block is one warpgroup walking 64-row
// tiles of a persistent grid, four blocks a multiprocessor so that one's loads run under the
// others' products; its weight tile stays in shared memory for the whole walk. For each tile:
//   h = sigmoid(g) o               in registers, rounded to bf16, as the A fragments of
//   y = h W^T + bias               m64n128k16 x 8, W resident in shared memory
//   out = x + scale y   or   y     from the accumulators' positions
// Every operand comes from global memory straight into this thread's fragment positions, with
// nothing staged in shared memory: that keeps four blocks a multiprocessor, which measured
// faster than staging g and o by cp.async and the pair side in row passes at two
// (docs/perf-notes.md, 2026-12-04). Per row it reads g, o and x and writes out, 1.5 KB with fp32 x: at
// N = 768 (589,824 rows) 0.91 GB, 0.19 ms at 4.8 TB/s; the product, 19 GFLOP, is far under it.
//
// Fragment positions (warp w, g = lane / 4, t = lane % 4), rows row0 = 16 w + g and row0 + 8:
//   A fragment of k16 step kk: a[2 hh + rr] holds (row0 + 8 rr, 16 kk + 8 hh + 2 t, + 1)
//   accumulator of n8 tile i:  acc[4 i + 2 rr + e] holds (row0 + 8 rr, 8 i + 2 t + e)
#include <cuda_bf16.h>

#include "activation/gate_math.cuh"
#include "common/kernel_attrs.h"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/wgmma.cuh"
#include "gated_linear/kernels.h"

namespace tpf::gated {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileRows = 64;  // rows of a tile: one warpgroup
constexpr int kThreads = 128;
constexpr int kBlocksPerSm = 4;               // the register budget's (<= 128 a thread, no spills)
constexpr int kSteps = kK / 16;               // k16 steps of the product
constexpr int kTiles8 = kN / 8;               // n8 accumulator tiles
constexpr uint32_t kHalfBytes = 128 * 64 * 2;  // one [128][64] half of the weight tile

struct Frag {
  int row0;  // first of this thread's two rows in the tile
  int col;   // 2 t: this thread's column within an 8-column group
  __device__ Frag() : row0(16 * (threadIdx.x / 32) + (threadIdx.x % 32) / 4), col(2 * (threadIdx.x % 4)) {}
};

__device__ __forceinline__ float2 load2(const bf16* p) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p)); }
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void store2(bf16* p, float a, float b) { *reinterpret_cast<uint32_t*>(p) = dev::MmaOp<bf16>::pack(a, b); }
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The scale's row (b, i, j) of row r, or null where there is none.
__device__ __forceinline__ const bf16* scale_row(const FwdArgs& a, int64_t r) {
  if (!a.scale.p) return nullptr;
  const Shape& n = a.shape;
  const int64_t j = r % n.J, i = (r / n.J) % n.I, b = r / (n.J * n.I);
  return static_cast<const bf16*>(a.scale.p) + b * a.scale.s[0] + i * a.scale.s[1] + j * a.scale.s[2];
}
// The scale of this thread's channels 8 i + 2 t, + 1 of a row from scale_row, as bf16 pairs (1
// without a scale): per channel, or one value for the row.
template <int kTiles>
__device__ __forceinline__ void scales_at(__nv_bfloat162 (&sc)[kTiles], const bf16* row, const Scale& s, int col) {
  if (row && s.s[3] == 1) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) sc[i] = *reinterpret_cast<const __nv_bfloat162*>(row + 8 * i + col);
    return;
  }
  const __nv_bfloat162 v = row ? __bfloat162bfloat162(*row) : __floats2bfloat162_rn(1.f, 1.f);
#pragma unroll
  for (int i = 0; i < kTiles; ++i) sc[i] = v;
}

// W [N][K] as the K-major B tile [2 halves][128 n][64 k] (128B-swizzled). Coalesced reads of W;
// once a block, so the scattered 2-byte stores do not matter.
__device__ __forceinline__ void load_weight(bf16* tile, const bf16* w) {
  for (int e = threadIdx.x; e < kN * kK; e += kThreads) *dev::halves_at<128>(tile, e / kK, e % kK) = w[e];
  dev::fence_proxy_async();  // the generic-proxy stores, visible to wgmma
  __syncthreads();
}

// h = sigmoid(g) o at this thread's A-fragment positions of the tile at m0 (zeros past the end).
__device__ __forceinline__ void gated_fragments(uint32_t (&h)[kSteps][4], const FwdArgs& a, int64_t m0, const Frag& f) {
  const int64_t rows = row_count(a.shape);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = m0 + f.row0 + 8 * rr;
    const bf16* g = a.g + r * a.ld_g + f.col;  // [K] row r, from this thread's column
    const bf16* o = a.o + r * a.ld_o + f.col;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int c = 16 * kk + 8 * hh;
        const float2 gv = r < rows ? load2(g + c) : make_float2(0.f, 0.f);
        const float2 ov = r < rows ? load2(o + c) : make_float2(0.f, 0.f);
        h[kk][2 * hh + rr] = dev::MmaOp<bf16>::pack(act::sigmoid(gv.x) * ov.x, act::sigmoid(gv.y) * ov.y);
      }
  }
}

// acc = h W^T over K = 128: A from registers, B the weight tile.
__device__ __forceinline__ void project(float (&acc)[64], const uint32_t (&h)[kSteps][4], uint32_t tile) {
  dev::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    dev::WgmmaN128RS<0>::run(acc, h[kk], dev::wgmma_desc(tile + (kk / 4) * kHalfBytes + 32 * (kk % 4), 16, 1024), kk > 0);
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(acc);
}

// out = x + scale round(y) (or round(y)) from the accumulators, y = acc + bias (the block's copy
// in shared memory). x and the scale are read before the first store: out may be x itself, so
// a global load after a store could not be hoisted above it (one L2 round trip each, in series).
template <class Tout>
__device__ __forceinline__ void store_out(const float (&acc)[64], const FwdArgs& a, const float* bias, int64_t m0,
                                          const Frag& f) {
  const int64_t rows = row_count(a.shape);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = m0 + f.row0 + 8 * rr;
    if (r >= rows) continue;
    const bf16* s = a.x ? scale_row(a, r) : nullptr;
    const Tout* x = a.x ? static_cast<const Tout*>(a.x) + r * kN + f.col : nullptr;  // [N] row r
    Tout* out = static_cast<Tout*>(a.out) + r * kN + f.col;
    float2 xv[kTiles8];          // x at the tile's columns 8 i + 2 t, + 1
    __nv_bfloat162 sc[kTiles8];  // the scale there
#pragma unroll
    for (int i = 0; i < kTiles8; ++i) xv[i] = x ? load2(x + 8 * i) : make_float2(0.f, 0.f);
    scales_at(sc, s, a.scale, f.col);
#pragma unroll
    for (int i = 0; i < kTiles8; ++i) {
      const int n = 8 * i + f.col;
      const float2 b = a.bias ? *reinterpret_cast<const float2*>(bias + n) : make_float2(0.f, 0.f);
      float y0 = round_bf16(acc[4 * i + 2 * rr] + b.x), y1 = round_bf16(acc[4 * i + 2 * rr + 1] + b.y);
      if (x) {
        const float2 scf = __bfloat1622float2(sc[i]);
        y0 = xv[i].x + scf.x * y0, y1 = xv[i].y + scf.y * y1;
      }
      store2(out + 8 * i, y0, y1);
    }
  }
}

template <class Tout>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) forward_kernel(FwdArgs a) {
  __shared__ __align__(1024) bf16 w_tile[kN * kK];  // B(n, k) = W[n][k], [2 halves][128][64]
  __shared__ __align__(8) float bias[kN];           // the bias, fp32 (zeros without one)
  for (int n = threadIdx.x; n < kN; n += kThreads) bias[n] = a.bias ? __bfloat162float(a.bias[n]) : 0.f;
  load_weight(w_tile, a.w);  // (its barrier publishes the bias too)
  const Frag f;
  const int64_t rows = row_count(a.shape);
  for (int64_t m0 = int64_t(blockIdx.x) * kTileRows; m0 < rows; m0 += int64_t(gridDim.x) * kTileRows) {
    uint32_t h[kSteps][4];
    gated_fragments(h, a, m0, f);
    float acc[64];  // y - bias at the accumulator positions
    project(acc, h, dev::smem_addr(w_tile));
    store_out<Tout>(acc, a, bias, m0, f);
  }
}

template <class Tout>
cudaError_t launch(const FwdArgs& a, cudaStream_t stream) {
  const int64_t tiles = (row_count(a.shape) + kTileRows - 1) / kTileRows;
  unsigned grid = 0;
  if (const cudaError_t e = tpf::detail::persistent_grid(tiles, kBlocksPerSm, &grid); e != cudaSuccess) return e;
  forward_kernel<Tout><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t forward(const FwdArgs& a, cudaStream_t stream) {
  if (row_count(a.shape) == 0) return cudaSuccess;
  return a.out_dtype == DType::kFP32 ? launch<float>(a, stream) : launch<bf16>(a, stream);
}

}  // namespace tpf::gated
