// Parts shared by the fused transition's forward and backward kernels (transition/forward.cu,
// backward.cu): the tile geometry, the weight chunks streamed by TMA, the up projection
// [a | b] = xhat W_ab^T on wgmma, and the register-fragment helpers.
//
// A block of two warpgroups walks 128-row tiles, each warpgroup owning 64 rows; the hidden
// units come in chunks of kChunk: W_ab's chunk is its a rows and b rows of the chunk
// ([2 k halves][64 a rows | 64 b rows][64 c], 128B-swizzled), W_o's chunk its columns
// ([128 c][64 hidden]).
#pragma once
#include <cuda.h>

#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/tma.cuh"
#include "common/tma.h"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"
#include "transition/kernels.h"
#include "transition/launch.h"

namespace tpf::transition {

using bf16 = __nv_bfloat16;

constexpr int kRows = 128;  // rows of a tile: two warpgroups of 64
constexpr uint32_t kHalf = kRows * 64 * 2;     // [128 rows][64] bf16, 128B-swizzled: 16 KB
constexpr uint32_t kAbStage = 2 * kHalf;       // W_ab chunk: [2 k halves][64 a | 64 b rows][64]
constexpr uint32_t kOStage = kC * kChunk * 2;  // W_o chunk: [128 c][64 hidden units]
static_assert(2 * kChunk == 128 && kC == 128, "one chunk's a | b is one m64n128 accumulator");

// Element (r, c) of a [2 halves][128][64] bf16 tile: channel c = 64 half + 8 chunk + e.
__device__ __forceinline__ bf16* half_tile_at(bf16* t, int r, int c) { return dev::halves_at<kRows>(t, r, c); }

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// A ring of shared-memory stages filled by TMA: per stage a full barrier (the copy's bytes
// landed) and an empty one (every consumer thread released it), 16 bytes a stage at `bars`.
// Chunk q takes stage q % stages in its use q / stages.
struct Ring {
  uint32_t smem, bars, stage_bytes;
  int stages;
  __device__ uint32_t full(int s) const { return bars + 16 * s; }
  __device__ uint32_t empty(int s) const { return bars + 16 * s + 8; }
  __device__ void init(int consumers) const {
    for (int s = 0; s < stages; ++s) dev::mbar_init(full(s), 1), dev::mbar_init(empty(s), consumers);
  }
  // Producer: waits for the stage's previous use to be released; returns the full barrier,
  // which now expects the stage's bytes.
  __device__ uint32_t acquire(int q) const {
    const int s = q % stages;
    if (q >= stages) dev::mbar_wait(empty(s), ((q / stages) - 1) & 1);
    dev::mbar_arrive_expect_tx(full(s), stage_bytes);
    return full(s);
  }
  __device__ uint32_t at(int q) const { return smem + (q % stages) * stage_bytes; }
  // Consumer: waits for chunk q's bytes; returns the stage's address.
  __device__ uint32_t wait(int q) const {
    dev::mbar_wait(full(q % stages), (q / stages) & 1);
    return at(q);
  }
  __device__ void release(int q) const { dev::mbar_arrive(empty(q % stages)); }
};
constexpr uint32_t kRingBarBytes = 16;  // a stage's two barriers

// The producer's TMA issues for the weight chunks: chunk q % nch of W_ab or W_o.
struct WeightLoads {
  const CUtensorMap* w_ab;
  const CUtensorMap* w_o;
  Ring ab, o;
  int H, nch;
  __device__ void load_ab(int q) const {
    const int j = q % nch;
    const uint32_t bar = ab.acquire(q), dst = ab.at(q);
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {
      dev::tma_load_2d(dst + kh * kHalf, w_ab, bar, 64 * kh, j * kChunk);
      dev::tma_load_2d(dst + kh * kHalf + kHalf / 2, w_ab, bar, 64 * kh, H + j * kChunk);
    }
  }
  __device__ void load_o(int q) const {
    const uint32_t bar = o.acquire(q);
    dev::tma_load_2d(o.at(q), w_o, bar, (q % nch) * kChunk, 0);
  }
};

// The block: two consumer warpgroups and a producer warpgroup, one thread of which issues every
// TMA copy; the producer hands its registers to the consumers (setmaxnreg: 168 each at launch,
// 384 x 168 <= 64 K; then 128 x 40 + 256 x 232).
constexpr int kConsumers = 256;
constexpr int kBlockThreads = kConsumers + 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;

__host__ __device__ inline int64_t tile_count(int64_t rows) { return (rows + kRows - 1) / kRows; }

// This block's tiles in the persistent grid: tile blockIdx.x, then every gridDim.x-th.
__device__ __forceinline__ int block_tiles(int64_t rows) {
  return static_cast<int>((tile_count(rows) - blockIdx.x + gridDim.x - 1) / gridDim.x);
}

// The dynamic shared window from its first 1024-byte boundary (the 128-byte swizzle's period).
__device__ __forceinline__ uint8_t* align_1024(uint8_t* raw) {
  return raw + ((1024 - (dev::smem_addr(raw) & 1023)) & 1023);
}

// Thread 0 initialises the kernel's own barriers (init()) and the rings', then the roles split:
// the producer warpgroup gives its registers up and its first thread runs produce(); the two
// consumer warpgroups take them and run consume().
template <class Init, class Produce, class Consume>
__device__ __forceinline__ void run_roles(const WeightLoads& ld, Init&& init, Produce&& produce, Consume&& consume) {
  if (threadIdx.x == 0) {
    init();
    ld.ab.init(kConsumers);
    ld.o.init(kConsumers);
    dev::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    dev::regs_decrease<kProducerRegs>();
    if (threadIdx.x == kConsumers) produce();
  } else {
    dev::regs_increase<kConsumerRegs>();
    consume();
  }
}

// acc = xhat W_ab,j^T for the warpgroup's 64 rows: 8 k16 steps over C (issued, not committed).
__device__ __forceinline__ void up_projection(float (&acc)[64], uint32_t xhat, uint32_t w_ab, int wg) {
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) {
    const uint32_t k_off = (kk / 4) * kHalf + 32 * (kk % 4);
    dev::Wgmma<bf16, 0, 0>::run(acc, dev::wgmma_desc(xhat + 64 * wg * 128 + k_off, 16, 1024),
                                dev::wgmma_desc(w_ab + k_off, 16, 1024), kk > 0);
  }
}

// Keeps A fragments live (their registers unreused) until the wgmma reading them is waited for.
template <int K>
__device__ __forceinline__ void keep_fragments(uint32_t (&h)[K][4]) {
#pragma unroll
  for (int kk = 0; kk < K; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(h[kk][i])::"memory");
}

}  // namespace tpf::transition
