// The GEMM engine's main loop on Hopper's warpgroup MMA (wgmma, sm_90a), for the long-K
// products (triangle products, weight gradients): each of the block's two warpgroups owns 64 rows of the 128 x 128 tile
// (or 128 x 256: two 128-column halves) and issues four m64n128k16 per k-step and half straight from the swizzled shared-memory stages (no
// ldmatrix, no per-warp operand fragments: mma.sync reached ~300 TFLOP/s on these products,
// with half the issue slots spent feeding it). Loads, stages, staging of the accumulators and
// the epilogues are the mma.sync engine's (gemm.cuh).
//
// Operand tiles as wgmma reads them with 128-byte swizzling, from a 1024-byte aligned stage:
//   K-major  [128 mn][64 k]: 8-row groups 1024 B apart (SBO); a k16 step is +32 B.
//   MN-major two [64 k][64 mn] halves 8 KB apart (LBO); 8-row k groups 1024 B apart (SBO); a
//            k16 step is +2 groups. Warpgroup g's A rows are the half (or rows) 64 g...
#pragma once
#include "common/wgmma.cuh"
#include "trimul/gemm.cuh"

namespace tpf::trimul {

namespace detail {

constexpr uint32_t kHalfBytes = Cfg::kBlockK * 64 * 2;  // one [64][64] 16-bit half, 8 KB
constexpr uint32_t kGroupBytes = 8 * 128;               // 8 rows of 128 bytes

// Descriptor of k16 step j of an operand tile at shared address `tile`; rows_off: the
// warpgroup's first MN row (A) or 0 (B).
template <Major MAJ>
__device__ __forceinline__ uint64_t operand_desc(uint32_t tile, int rows_off, int j) {
  if constexpr (MAJ == Major::kK) {
    return dev::wgmma_desc(tile + rows_off * 128 + 32 * j, 16, kGroupBytes);
  } else {
    return dev::wgmma_desc(tile + (rows_off / 64) * kHalfBytes + 2 * kGroupBytes * j, kHalfBytes, kGroupBytes);
  }
}

}  // namespace detail

// An epilogue may take the wgmma accumulators from registers by defining
// `void wgmma_fragments(const float (&acc)[64], int row0, int m0, int n0, int z)`: thread
// (g = lane / 4, t = lane % 4) of the warp whose 16 rows start at row0 holds acc[4i + e] at
// (row0 + g + 8 (e / 2), column 8i + 2t + e % 2), i < 16. No shared memory is staged then.
template <class Epi, class = void>
struct HasWgmmaFragments : std::false_type {};
template <class Epi>
struct HasWgmmaFragments<Epi, std::void_t<decltype(std::declval<const Epi&>().wgmma_fragments(
                                  std::declval<const float (&)[64]>(), 0, int64_t{0}, 0, 0))>> : std::true_type {};

// The main loop's shape for kNH 128-column halves per block: 128 x 128 (kNH = 1, two blocks
// per SM, three stages) or the wide product tiles (tile_config.h's WideProductConfig).
template <int kNH>
struct WgmmaTiles {
  static_assert(kNH == 1 || kNH == WideProductConfig::kNHalves, "the tile table's two shapes");
  static constexpr int kBlockN = kNH * Cfg::kBlockN;
  static constexpr int kStages = kNH == 1 ? Cfg::kStages : WideProductConfig::kStages;
  // wgmma batches left running across a k-step's barrier: with one block per SM nothing else
  // hides the batch's latency. The loads then run kStages - 2 k-steps ahead, into the stage the
  // batch before the running one read.
  static constexpr int kInFlight = kNH == 1 ? 0 : 1;
  static constexpr int kAhead = kStages - 1 - kInFlight;
  static constexpr int kMinBlocks = kNH == 1 ? 2 : 1;
  static constexpr int kStageBytes = StageLoader<__half, Major::kK, Major::kK, true, kNH>::kBytes;
  // One more KB than the stages or the epilogue's view (whichever is larger): the stages start on
  // a 1024-byte boundary (the swizzle pattern's period), wherever the dynamic window begins.
  static constexpr int kSmemBytes =
      (kStages * kStageBytes > kGemmSmemBytes ? kStages * kStageBytes : kGemmSmemBytes) + 1024;
  static_assert(kMinBlocks * kSmemBytes <= 227 * 1024, "the blocks per SM planned");
};

// k16 step j of one k-step: each warpgroup's 64 rows against every 128-column half of B (the
// halves sit kTileElems apart in the stage; both descriptor forms advance by its bytes).
template <class T, Major AM, Major BMJ, int kNH>
__device__ __forceinline__ void mma_k_step(float (&acc)[kNH][64], uint32_t ta, uint32_t tb, int wg) {
  constexpr uint32_t kBTileBytes = detail::kTileElems * 2;
#pragma unroll
  for (int j = 0; j < Cfg::kBlockK / 16; ++j)
#pragma unroll
    for (int h = 0; h < kNH; ++h)
      dev::Wgmma<T, AM == Major::kMN, BMJ == Major::kMN>::run(
          acc[h], detail::operand_desc<AM>(ta, 64 * wg, j), detail::operand_desc<BMJ>(tb + h * kBTileBytes, 0, j), 1);
}

// The epilogue of 128-column half h: from registers (wgmma_fragments) or staged in shared memory.
template <class Epi>
__device__ __forceinline__ void wgmma_epilogue(const Epi& epi, uint8_t* smem, const float (&acc)[64], int wg,
                                               int64_t m0, int n0, int z) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
  if constexpr (HasWgmmaFragments<Epi>::value) {
    epi.wgmma_fragments(acc, 64 * wg + 16 * w, m0, n0, z);
  } else {
    const EpiTile tile = epi_tile(smem, false);
    stage_accumulators(epi, tile, n0, [&](auto&& at) {
#pragma unroll
      for (int i = 0; i < Cfg::kBlockN / 8; ++i) {
        const int r = 64 * wg + 16 * w + g, n = 8 * i + 2 * t;
        at(r, n) = acc[4 * i];
        at(r, n + 1) = acc[4 * i + 1];
        at(r + 8, n) = acc[4 * i + 2];
        at(r + 8, n + 1) = acc[4 * i + 3];
      }
    });
    epi(tile, m0, n0, z);
  }
}

template <class T, Major AM, Major BMJ, int kNH, class Epi>
__global__ void __launch_bounds__(Cfg::kThreads, WgmmaTiles<kNH>::kMinBlocks)
    gemm_wgmma_kernel(const Operand A, const Operand B, const GemmShape s, const Epi epi) {
  static_assert(Cfg::kThreads == 256 && Cfg::kBlockM == 128 && Cfg::kBlockN == 128 && Cfg::kBlockK == 64,
                "two warpgroups of m64n128k16, four per k-step and 128-column half");
  using Tiles = WgmmaTiles<kNH>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (dev::smem_addr(smem_raw) & 1023)) & 1023);
  const BlockTile bt(s, Tiles::kBlockN);
  const StageLoader<T, AM, BMJ, true, kNH> ld(smem, A, B, s, bt);
  const int wg = threadIdx.x / 128;  // warpgroup: A rows [64 wg, 64 wg + 64)
  float acc[kNH][64] = {};           // [half][4 n8 + c]: the wgmma accumulator layout (common/wgmma.cuh)

#pragma unroll
  for (int st = 0; st < Tiles::kAhead; ++st) {
    if (st < bt.nk) ld.load(st, bt.k_begin + int64_t(st) * Cfg::kBlockK);
    dev::cp_async_commit();
  }
  for (int kt = 0; kt < bt.nk; ++kt) {
    dev::cp_async_wait<Tiles::kAhead - 1>();
    dev::fence_proxy_async();  // this thread's cp.async writes, visible to wgmma's reads
    __syncthreads();           // everyone's; and batch kt - 1 - kInFlight is done everywhere
    const int pre = kt + Tiles::kAhead;
    if (pre < bt.nk) ld.load(pre % Tiles::kStages, bt.k_begin + int64_t(pre) * Cfg::kBlockK);
    dev::cp_async_commit();
    const int st = kt % Tiles::kStages;
    dev::wgmma_fence();
    mma_k_step<T, AM, BMJ, kNH>(acc, dev::smem_addr(ld.stage_a(st)), dev::smem_addr(ld.stage_b(st)), wg);
    dev::wgmma_commit();
    dev::wgmma_wait<Tiles::kInFlight>();
#pragma unroll
    for (int h = 0; h < kNH; ++h) dev::wgmma_fence_operands(acc[h]);
  }
  dev::wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < kNH; ++h) dev::wgmma_fence_operands(acc[h]);
  dev::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kNH; ++h) {
    if (h > 0 && !HasWgmmaFragments<Epi>::value) __syncthreads();  // the staged tile is free again
    wgmma_epilogue(epi, smem, acc[h], wg, bt.m0, bt.n0 + h * Cfg::kBlockN, bt.z);
  }
}

// launch_gemm's contract (gemm.cuh) on the wgmma main loop (split-K included), with kNH
// 128-column halves per block; epilogue prefetching is not offered (it needs a short K).
template <class T, Major AM, Major BMJ, int kNH = 1, class Epi>
cudaError_t launch_gemm_wgmma(const Operand& A, const Operand& B, const GemmShape& s, int batches,
                              const Epi& epi, cudaStream_t stream) {
  using Tiles = WgmmaTiles<kNH>;
  return launch_tiles<Epi>(gemm_wgmma_kernel<T, AM, BMJ, kNH, Epi>, Tiles::kSmemBytes, A, B, s, batches, epi, stream,
                           Tiles::kBlockN);
}

}  // namespace tpf::trimul
