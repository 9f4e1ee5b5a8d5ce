// The GEMM engine's main loop on Hopper's warpgroup MMA (wgmma, sm_90a), for the long-K
// products (weight gradients, d x̂ products; the triangle products where gemm_tma.cuh's loop
// cannot take them) and the input projection: each of the block's two warpgroups owns 64 rows
// of the 128 x 128 tile and issues four m64n128k16 per k-step straight from the swizzled
// shared-memory stages (no ldmatrix, no per-warp operand fragments: mma.sync reached ~300
// TFLOP/s on these products, with half the issue slots spent feeding it). Loads, stages, staging of the accumulators and
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

// Or, by defining `bool wgmma_fragments(const EpiTile&, const float (&acc)[64], int row0,
// int64_t m0, int n0, int z)`, stage what it needs in the tile's shared memory itself; false
// (uniform over the block, before it touches shared memory) hands the tile to the staged path.
template <class Epi, class = void>
struct HasWgmmaTileFragments : std::false_type {};
template <class Epi>
struct HasWgmmaTileFragments<Epi, std::void_t<decltype(std::declval<const Epi&>().wgmma_fragments(
                                      std::declval<const EpiTile&>(), std::declval<const float (&)[64]>(), 0,
                                      int64_t{0}, 0, 0))>> : std::true_type {};

// One more KB than the mma.sync kernel: the stages start on a 1024-byte boundary (the swizzle
// pattern's period), wherever the dynamic shared window begins.
constexpr int kWgmmaSmemBytes = kGemmSmemBytes + 1024;

template <class T, Major AM, Major BMJ, class Epi>
__global__ void __launch_bounds__(Cfg::kThreads, 2)
    gemm_wgmma_kernel(const Operand A, const Operand B, const GemmShape s, const Epi epi) {
  static_assert(Cfg::kThreads == 256 && Cfg::kBlockM == 128 && Cfg::kBlockN == 128 && Cfg::kBlockK == 64,
                "two warpgroups of m64n128k16, four per k-step");
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (dev::smem_addr(smem_raw) & 1023)) & 1023);
  const BlockTile bt(s);
  const StageLoader<T, AM, BMJ, true> ld(smem, A, B, s, bt);
  const int wg = threadIdx.x / 128;  // warpgroup: A rows [64 wg, 64 wg + 64)
  float acc[64] = {};                // [4 n8 + c]: the wgmma accumulator layout (common/wgmma.cuh)

#pragma unroll
  for (int st = 0; st < Cfg::kStages - 1; ++st) {
    if (st < bt.nk) ld.load(st, bt.k_begin + int64_t(st) * Cfg::kBlockK);
    dev::cp_async_commit();
  }
  for (int kt = 0; kt < bt.nk; ++kt) {
    dev::cp_async_wait<Cfg::kStages - 2>();
    dev::fence_proxy_async();  // this thread's cp.async writes, visible to wgmma's reads
    __syncthreads();           // everyone's; and batch kt - 1 is done everywhere (waited below)
    const int pre = kt + Cfg::kStages - 1;
    if (pre < bt.nk) ld.load(pre % Cfg::kStages, bt.k_begin + int64_t(pre) * Cfg::kBlockK);
    dev::cp_async_commit();
    const int st = kt % Cfg::kStages;
    const uint32_t ta = dev::smem_addr(ld.stage_a(st)), tb = dev::smem_addr(ld.stage_b(st));
    dev::wgmma_fence();
#pragma unroll
    for (int j = 0; j < Cfg::kBlockK / 16; ++j)
      dev::Wgmma<T, AM == Major::kMN, BMJ == Major::kMN>::run(
          acc, detail::operand_desc<AM>(ta, 64 * wg, j), detail::operand_desc<BMJ>(tb, 0, j), 1);
    dev::wgmma_commit();
    dev::wgmma_wait<0>();
    dev::wgmma_fence_operands(acc);
  }
  dev::cp_async_wait<0>();
  __syncthreads();

  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
  if constexpr (HasWgmmaFragments<Epi>::value) {
    epi.wgmma_fragments(acc, 64 * wg + 16 * w, bt.m0, bt.n0, bt.z);
  } else {
    const EpiTile tile = epi_tile(smem, false);
    if constexpr (HasWgmmaTileFragments<Epi>::value) {
      if (epi.wgmma_fragments(tile, acc, 64 * wg + 16 * w, bt.m0, bt.n0, bt.z)) return;
    }
    stage_accumulators(epi, tile, bt.n0, [&](auto&& at) {
#pragma unroll
      for (int i = 0; i < Cfg::kBlockN / 8; ++i) {
        const int r = 64 * wg + 16 * w + g, n = 8 * i + 2 * t;
        at(r, n) = acc[4 * i];
        at(r, n + 1) = acc[4 * i + 1];
        at(r + 8, n) = acc[4 * i + 2];
        at(r + 8, n + 1) = acc[4 * i + 3];
      }
    });
    epi(tile, bt.m0, bt.n0, bt.z);
  }
}

// launch_gemm's contract (gemm.cuh) on the wgmma main loop (split-K included); epilogue
// prefetching is not offered (it needs a short K).
template <class T, Major AM, Major BMJ, class Epi>
cudaError_t launch_gemm_wgmma(const Operand& A, const Operand& B, const GemmShape& s, int batches,
                              const Epi& epi, cudaStream_t stream) {
  return launch_tiles<Epi>(gemm_wgmma_kernel<T, AM, BMJ, Epi>, kWgmmaSmemBytes, A, B, s, batches, epi, stream);
}

}  // namespace tpf::trimul
