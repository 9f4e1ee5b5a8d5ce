// The math of a fused multiplicative-update backward tail, alone (docs/perf-notes.md, "The
// largest remaining design step"): the projection backward and d x̂_in in one kernel, whose
// byte floor at N = 768 is 0.67 ms. This probe times what its two consumer warpgroups would do
// with every tile already in shared memory (no loads, no stores to device memory), to hold
// against that floor before the kernel is built. Not the library.
//
// One block = two warpgroups, each owning 64 pixel rows of a 128-pixel row tile. Per row tile
// and warpgroup, for each of the four a/b column tiles of dlin (128 interleaved projection /
// gate columns, 64 channels):
//   [p | g] = x̂ Wcat_tileᵀ            m64n128k16 x 8, fp16, both operands from shared memory
//   s = sigmoid(g); d p = da s; d g = da p s (1 - s)   (da from a shared fp32 tile)
//   dlin's high and low bf16 parts -> shared memory by stmatrix (the A operand's swizzle)
//   per-tile column sums of d p, d g: a shuffle tree over the warp's rows (pessimistic)
//   d x̂ += dlin_hi W_tile + dlin_lo W_tile   m64n128k16 x 16, bf16
// then the gate tile (dlin's gate columns = dgate, already in shared memory): d x̂ += dgate W
// (x 8), and LayerNorm_in's backward on the d x̂ accumulator (row sums across the quad's lanes;
// d gamma and d beta left out).
//
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I src -o trimul_tail_math \
//          dev/probes/trimul_tail_math.cu
// Run:   ./trimul_tail_math [row tiles per block = 35]   (35 x 132 blocks x 128 pixels covers the
//        589,824 pixels of N = 768; C = Ch = 128)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe_timing.cuh"

#include "common/mma.cuh"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"

namespace {

namespace dev = tpf::dev;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr uint32_t kHalf = 128 * 64 * 2;  // one [128 rows][64] 16-bit half of a 128 x 128 tile
constexpr uint32_t kTile = 2 * kHalf;     // 32 KB
// Shared memory, byte offsets from a 1024-byte aligned base: K-major 128-byte-swizzled tiles.
constexpr uint32_t kX = 0;                  // x̂ [128 px][128 C] fp16
constexpr uint32_t kWcat = kX + kTile;      // Wcat tile [128 cols][128 C] fp16 (recompute's B)
constexpr uint32_t kWraw = kWcat + kTile;   // Wraw tileᵀ [128 C][128 cols] bf16 (d x̂'s B)
constexpr uint32_t kHi = kWraw + kTile;     // dlin high parts [128 px][128 cols] bf16 (d x̂'s A)
constexpr uint32_t kLo = kHi + kTile;       // dlin low parts
constexpr uint32_t kDa = kLo + kTile;       // da for the tile's 64 channels [128 px][64] fp32
constexpr uint32_t kBytes = kDa + 128 * 64 * 4 + 1024;  // the LayerNorm reads x̂ from kX
static_assert(kBytes <= 227 * 1024, "one block per SM");

__device__ uint32_t hash(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352d, x ^= x >> 15, x *= 0x846ca68b;
  return x ^ (x >> 16);
}

__device__ void fill(uint8_t* s) {
  for (uint32_t i = threadIdx.x; i < kDa / 2; i += kThreads) {
    const float v = (hash(i + 31 * blockIdx.x) % 1024) / 1024.f - 0.5f;
    if (i < kWraw / 2) reinterpret_cast<__half*>(s)[i] = __float2half(v);
    else reinterpret_cast<bf16*>(s)[i] = __float2bfloat16(0.01f * v);
  }
  for (uint32_t i = threadIdx.x; i < 128 * 64; i += kThreads)
    reinterpret_cast<float*>(s + kDa)[i] = (hash(i) % 1024) / 1024.f - 0.5f;
}

// Descriptor of k16 step kk of a K-major 128 x 128 tile, from row `row0`.
__device__ __forceinline__ uint64_t kdesc(uint32_t tile, int row0, int kk) {
  return dev::wgmma_desc(tile + (kk / 4) * kHalf + row0 * 128 + 32 * (kk % 4), 16, 1024);
}

// Byte offset of the 16-byte chunk (row, 8-column group n8) in a K-major 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t chunk_at(int row, int n8) {
  return (n8 / 8) * kHalf + row * 128 + (((n8 % 8) ^ (row % 8)) << 4);
}

// This thread's packed pairs of one m16 slice (rows 16 w + g, + 8) to a tile by stmatrix.
__device__ __forceinline__ void put(uint32_t tile, const uint32_t (&pk)[16][2], int row0) {
  const int lane = threadIdx.x & 31, mx = lane >> 3, j = lane & 7;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t r[4] = {pk[2 * k][0], pk[2 * k + 1][0], pk[2 * k][1], pk[2 * k + 1][1]};
    dev::stmatrix_x4(tile + chunk_at(row0 + 8 * (mx >> 1) + j, 2 * k + (mx & 1)), r);
  }
}

__device__ __forceinline__ float sum_rows(float v) {  // over the warp's 8 row groups (g)
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

// kSums: the bias gradients' per-tile column sums by a shuffle tree (a reduce-scatter would take
// fewer shuffles); false bounds what they cost.
template <bool kSums>
__global__ void __launch_bounds__(kThreads, 1) tail_math(int tiles, float* out) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* s = smem_raw + ((1024 - (dev::smem_addr(smem_raw) & 1023)) & 1023);
  fill(s);
  __syncthreads();
  const uint32_t base = dev::smem_addr(s);
  const int wg = threadIdx.x / 128, w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = 64 * wg + 16 * w;  // this warp's first row in the tile
  const float* da = reinterpret_cast<const float*>(s + kDa);
  float keep = 0.f;
  for (int tile = 0; tile < tiles; ++tile) {
    float dx[64];  // d x̂ of the warpgroup's 64 rows
    bool first = true;
#pragma unroll
    for (int nt = 0; nt < 5; ++nt) {
      if (nt < 4) {
        float pg[64];  // [p | g] pairs: pg[4i + e] at (row0 + g + 8 (e / 2), column 8i + 2t + e % 2)
        dev::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) dev::Wgmma<__half, 0, 0>::run(pg, kdesc(base + kX, 64 * wg, kk), kdesc(base + kWcat, 0, kk), kk > 0);
        dev::wgmma_commit();
        dev::wgmma_wait<0>();
        dev::wgmma_fence_operands(pg);
        uint32_t hi[16][2], lo[16][2];  // [n8 tile][row half] (d p, d g) bf16 pairs
        float cs[32];                   // [2i + e] column sums of this thread's rows
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          cs[2 * i] = cs[2 * i + 1] = 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float p = pg[4 * i + 2 * h], gl = pg[4 * i + 2 * h + 1];
            const float a = da[(row0 + g + 8 * h) * 64 + 4 * i + t];
            const float sg = __frcp_rn(1.f + __expf(-gl));
            const float dp = a * sg, dg = a * p * sg * (1.f - sg);
            cs[2 * i] += dp, cs[2 * i + 1] += dg;
            const __nv_bfloat162 h2 = __floats2bfloat162_rn(dp, dg);
            const float2 back = __bfloat1622float2(h2);
            hi[i][h] = *reinterpret_cast<const uint32_t*>(&h2);
            lo[i][h] = dev::MmaOp<bf16>::pack(dp - back.x, dg - back.y);
          }
        }
        put(base + kHi, hi, row0);
        put(base + kLo, lo, row0);
        if constexpr (kSums) {
#pragma unroll
          for (int i = 0; i < 32; ++i) keep += sum_rows(cs[i]);
        } else {
#pragma unroll
          for (int i = 0; i < 32; ++i) keep += cs[i];
        }
        dev::fence_proxy_async();
        dev::bar_sync(1 + wg, 128);  // the warpgroup's dlin rows written: wgmma may read them
      }
      dev::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        dev::Wgmma<bf16, 0, 0>::run(dx, kdesc(base + kHi, 64 * wg, kk), kdesc(base + kWraw, 0, kk), !first || kk > 0);
        if (nt < 4) dev::Wgmma<bf16, 0, 0>::run(dx, kdesc(base + kLo, 64 * wg, kk), kdesc(base + kWraw, 0, kk), 1);
      }
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::wgmma_fence_operands(dx);
      dev::bar_sync(1 + wg, 128);  // dlin read: the next column tile may overwrite it
      first = false;
    }
    // LayerNorm_in's backward on d x̂ (gamma = 1): dz = rstd (g - mean(g) - xh mean(g xh)).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + g + 8 * h;
      float xr[32];  // [2i + e] x̂ at this thread's columns of the row, from the swizzled fp16 tile
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(s + kX + chunk_at(row, i) + 4 * t));
        xr[2 * i] = v.x, xr[2 * i + 1] = v.y;
      }
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = dx[4 * i + 2 * h + e];
          s1 += v, s2 += v * xr[2 * i + e];
        }
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1), s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      s2 += __shfl_xor_sync(0xffffffffu, s2, 1), s2 += __shfl_xor_sync(0xffffffffu, s2, 2);
      s1 *= 1.f / 128, s2 *= 1.f / 128;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) keep += 0.9f * (dx[4 * i + 2 * h + e] - s1 - xr[2 * i + e] * s2);
    }
  }
  out[blockIdx.x * kThreads + threadIdx.x] = keep;
}

template <bool kSums>
void time_variant(int tiles, float* out) {
  auto kernel = tail_math<kSums>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  const float best = probe::best_of_5_ms([&] { kernel<<<132, kThreads, kBytes>>>(1, out); },
                                         [&] { kernel<<<132, kThreads, kBytes>>>(tiles, out); });
  std::printf("fused tail math alone, column sums %s, 132 blocks x %d row tiles: %.3f ms (%s)\n",
              kSums ? "by shuffles" : "left out   ", tiles, best, cudaGetErrorString(cudaGetLastError()));
}

}  // namespace

int main(int argc, char** argv) {
  const int tiles = argc > 1 ? std::atoi(argv[1]) : 35;
  float* out = nullptr;
  cudaMalloc(&out, 132 * kThreads * sizeof(float));
  std::printf("N = 768 is 35 row tiles a block; the fused kernel's byte floor there is 0.67 ms\n");
  time_variant<true>(tiles, out);
  time_variant<false>(tiles, out);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
