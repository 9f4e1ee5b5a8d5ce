// The one place for triangle attention tile sizes. Each number says why it is what it is.
#pragma once

namespace tpf::attn {

// Forward: one block = 4 warps = one (b, s, h) slice x 64 query rows; each warp owns 16 rows
// (the M of one m16n8k16 MMA), so P never leaves registers. Key tiles: 128 columns at D = 32
// halve the per-tile fixed work (barrier, copies, row max/sum bookkeeping) for 64 S registers
// per thread: 1.70 vs 1.81 ms at N = 768 (perf-notes v6), and with the bias MMA 1.53 vs 1.56
// against 64 columns at 4 blocks/SM (v11). At D = 16 the 64-column tile at 4 blocks/SM (128
// registers, 16 warps) wins since the bias MMA: 1.24 vs 1.27 ms (v11). At D >= 64, 64 columns
// keep S at 32 registers next to the larger O accumulator. An fp32 bias at D = 32 takes 64
// columns: its 128-column tiles (32 KB a stage) leave room for 2 blocks/SM only, and 64 columns
// measured 1.81 against 2.32 ms at N = 768 (-22%; 16-bit bias 1.21 vs 1.15, so it keeps 128;
// perf-notes v18). With its tiles by TMA (v19), 64 columns still win: 1.31 against 1.53 ms.
#ifndef TPF_FWD_BLOCK_K_D32  // build-time experiment knobs (see docs/perf-history.md)
#define TPF_FWD_BLOCK_K_D32 128
#endif
#ifndef TPF_FWD_BLOCK_K_D32_FP32_BIAS
#define TPF_FWD_BLOCK_K_D32_FP32_BIAS 64
#endif
#ifndef TPF_FWD_MIN_BLOCKS_D32  // resident blocks per SM the register budget must allow (0: the
#define TPF_FWD_MIN_BLOCKS_D32 0  // compiler's choice)
#endif
#ifndef TPF_FWD_BLOCK_K_D16
#define TPF_FWD_BLOCK_K_D16 64
#endif
#ifndef TPF_FWD_MIN_BLOCKS_D16
#define TPF_FWD_MIN_BLOCKS_D16 4
#endif
// D = 16 with a 16-bit bias loaded by TMA (v19): without the copies' address registers the
// 128-column tile compiles to 125 registers, so it keeps 4 blocks/SM (the compiler's choice):
// 0.980 against 1.115 ms at N = 768 for 64 columns; the cp.async kernel at 128 columns takes 168
// registers (3 blocks/SM) and keeps 64. With an fp32 bias 128 columns lose (1.515 vs 1.234 ms).
#ifndef TPF_FWD_BLOCK_K_D16_TMA
#define TPF_FWD_BLOCK_K_D16_TMA 128
#endif
// kBiasBytes: the bias element's size (2: the activations' dtype, 4: fp32); kTma: the kernel
// that loads its tiles by TMA (forward.cu), where that changes the best tile.
template <int D, int kBiasBytes, bool kTma = false>
struct FwdConfig {
  static constexpr bool kD16Tma16 = D == 16 && kBiasBytes == 2 && kTma;  // takes 128-key tiles
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockQ = 16 * kWarps;  // 64
  static constexpr int kBlockK = D == 16   ? (kD16Tma16 ? TPF_FWD_BLOCK_K_D16_TMA : TPF_FWD_BLOCK_K_D16)
                                 : D == 32 ? (kBiasBytes == 4 ? TPF_FWD_BLOCK_K_D32_FP32_BIAS : TPF_FWD_BLOCK_K_D32)
                                           : 64;
  static constexpr int kStages = 2;            // K/V double buffer: load tile j+1 during tile j
  // Resident blocks per SM the registers must allow (0: the compiler's choice, forward.cu's
  // fwd_min_blocks). D = 64 by TMA: 3, where the compiler would take 174 registers with an fp32
  // bias (2 blocks/SM); 168 do without spills.
  static constexpr int kMinBlocks = D == 16   ? (kD16Tma16 ? 0 : TPF_FWD_MIN_BLOCKS_D16)
                                    : D == 32 ? TPF_FWD_MIN_BLOCKS_D32
                                              : (D == 64 && kTma ? 3 : 0);
};

// Backward (key-tile parallel): one block owns a 64-key tile of one (b, h) and walks query
// tiles (64 rows at D <= 32, 32 above). A "quad" of 4 warps computes one slice (each warp 16
// keys = one MMA M); kSlices quads run side by side on consecutive slices so that one bias tile
// load serves all of them and their dS tiles are summed before the single read-modify-write of
// the block's private dbias partial: bias reads and dbias traffic shrink by kSlices. kSlices is
// limited by registers: dK and dV of 16 keys x D stay in registers, which at D = 128 fills a
// thread's budget with one quad per block. At D <= 32, two quads with 64-query steps beat four
// quads with 32-query steps (which spill at 128 registers) and one quad (twice the dbias
// traffic): 10.1 vs 11.0 vs 16.2 ms forward+backward at N = 768 (perf-notes v5).
// One more warpgroup, the helper, does the reductions (perf-notes v12): two warps finish the dbias
// partial, two add the dQ parts in key-tile order (the turn wait, fetch, store and release that
// cost the math warps ~2000 of a ~6400-cycle step).
#ifndef TPF_BWD_SLICES_SMALL_D  // build-time experiment knobs for D <= 32 (see docs/perf-history.md)
#define TPF_BWD_SLICES_SMALL_D 2
#endif
#ifndef TPF_BWD_BLOCK_Q_SMALL_D  // 32 no longer builds at D = 16: its copies pass 64 rows at once
#define TPF_BWD_BLOCK_Q_SMALL_D 64
#endif
// Registers per helper thread when two quads take the rest: 96 is the least at which the helper
// does not spill (its dQ warps hold 8 chunks of the running sum); the math gets 200 and uses
// ~192. Helper 72 / 56 (math 216 / 224): 7.62 / 7.97 vs 7.10 ms at D = 32 (perf-notes v12). The
// wgmma math at D = 32 fits 184, but helper 128 with 16 chunks a round trip measured equal (v13).
#ifndef TPF_BWD_HELPER_REGS
#define TPF_BWD_HELPER_REGS 96
#endif
// Tensor-core form of the backward's products at D = 32 (each quad is one warpgroup): 0 mma.sync
// (ldmatrix fragments, every warp reading the whole Q / dO / K tile of its quad), 1 wgmma for
// S^T, dP^T (m64n64k16, both operands from shared memory) and dV, dK (m64n32k16, P^T and dS^T from
// registers), 2 also dQ (m64n32k16, dS^T MN-major from shared memory). wgmma reads a shared
// operand once per warpgroup: ~72 instead of ~208 KB of operand reads per step. fwd+bwd at
// N = 768: 7.22 (0), 6.88 (1), 6.91 ms (2); with 3 dQ stages 6.56 (1) vs 6.93 (2) (perf-notes v13).
// The other head dims keep mma.sync.
#ifndef TPF_BWD_WGMMA_D32
#define TPF_BWD_WGMMA_D32 1
#endif
// Stages of the dQ part buffer between the math warps and the two dQ warps. A stage is held from
// the math's hand-over until the dQ warp has waited for its key tile's turn and added it (~10,700
// cycles at N = 768, D = 32: perf-notes v13); with 2 stages the math waited for a free one (the
// largest stall of the math warps in Nsight Compute's samples). 3 stages: fwd+bwd 6.82 -> 6.54 ms
// at N = 768, D = 32, D = 16 and 64 equal or better; D = 128 (one quad, 16 KB a stage) slower
// at N = 384 (5.13 -> 5.38 ms), so it keeps 2 (a1d0f33:bench/results/h200/v13_iter/ab_rounds_v13b_dq_stages.txt).
#ifndef TPF_BWD_DQ_STAGES
#define TPF_BWD_DQ_STAGES 3
#endif
template <int D>
struct BwdConfig {
  static constexpr int kBlockK = 64;
  // Query rows per step: S^T and dP^T take BQ/2 registers each per thread.
  static constexpr int kBlockQ = D <= 32 ? TPF_BWD_BLOCK_Q_SMALL_D : 32;
  static constexpr int kSlices = D <= 32 ? TPF_BWD_SLICES_SMALL_D : (D == 64 ? 2 : 1);
  static constexpr int kWgmma = D == 32 && kBlockQ == 64 ? TPF_BWD_WGMMA_D32 : 0;
  static constexpr int kDqStages = D == 128 ? 2 : TPF_BWD_DQ_STAGES;
  static_assert(kDqStages >= 2 && kDqStages <= 3, "named barrier ids (backward.cu's BwdBarrier)");
  static constexpr int kMathWarps = 4 * kSlices;
  static constexpr int kMathThreads = 32 * kMathWarps;
  static constexpr int kHelperThreads = 128;  // one warpgroup: 2 dbias warps, 2 dQ warps
  static constexpr int kThreads = kMathThreads + kHelperThreads;
  // Register split (setmaxnreg) when the launch's 65536 / kThreads budget is below what the
  // math needs: the helper keeps kHelperRegs, the math warps take the rest (a multiple of 8).
  // With one quad (256 threads) every thread already gets 255: no split.
  static constexpr bool kSplitRegs = kThreads > 256;
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;  // 168 at 384 threads
  static constexpr int kHelperRegs = TPF_BWD_HELPER_REGS;
  static constexpr int kMathRegs =
      ((kLaunchRegs * kThreads - kHelperRegs * kHelperThreads) / kMathThreads) / 8 * 8;
  static_assert(!kSplitRegs || (kMathRegs <= 256 && kHelperRegs >= 24), "setmaxnreg range");
};

// dQ turn chains. The key tiles of a (slice group, query tile) add their dQ parts one after
// another, handed on by a turn counter. At D = 32 with 2 to kBwdShortChainTiles key tiles (N <= 640)
// they do so in two interleaved chains (key tile kb in chain kb % 2, each into its own fp32
// accumulator, summed in chain order by dq_finalize), and the dQ part buffer's rows are padded
// against bank conflicts (BwdSmem::kDqPitch): fwd+bwd -8.5, -7.2, -6.2, -4.1% at N = 256, 384, 512,
// 640 (perf-notes v17). At N = 768 the same costs +2.8%: there the chain's lag and the second
// accumulator (~9 MB) meet a full L2, so longer rows of key tiles keep one chain and no padding.
// D = 16 measured within +-3% either way, so the other head dims keep one chain.
#ifndef TPF_BWD_SHORT_CHAIN_TILES  // build-time experiment knob
#define TPF_BWD_SHORT_CHAIN_TILES 10
#endif
constexpr int kBwdShortChainTiles = TPF_BWD_SHORT_CHAIN_TILES;
constexpr int bwd_dq_chains(int head_dim, int key_tiles) {
  return head_dim == 32 && key_tiles >= 2 && key_tiles <= kBwdShortChainTiles ? 2 : 1;
}

// Blocks the backward aims to launch: 4 waves of 132 SMs bound the tail of the last wave to
// a quarter. It fixes how slices are cut into chunks (and so the dbias partial count), so it
// is a constant of the library, not read from the device: results stay bitwise identical on
// any GPU.
constexpr int kBwdTargetBlocks = 4 * 132;

}  // namespace tpf::attn
