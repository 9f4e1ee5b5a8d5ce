// The tile choices of triangle attention: numbers only, one table per kernel, each row with its
// reason. The measurements behind them, dated, are in docs/perf-history.md ("Tile choices").
#pragma once

namespace tpf::attn {

// Forward: one block = 4 warps = one (b, s, h) slice x 64 query rows; each warp owns 16 rows
// (one m16n8k16 M), so P never leaves registers. K/V tiles are double-buffered.
struct FwdTile {
  int head_dim, bias_bytes;  // bias_bytes: 2 = the activations' dtype, 4 = fp32
  bool tma;                  // tiles loaded by TMA (forward.cu), else cp.async
  int block_k;               // keys per tile
  int min_blocks;            // resident blocks per SM the registers must allow (0: compiler's choice)
};
inline constexpr FwdTile kFwdTiles[] = {
    // D  bias  TMA  keys  blocks
    {16, 2, false, 64, 4},    // 128 keys need 168 registers here: 3 blocks/SM lose to 4
    {16, 2, true, 128, 0},    // TMA frees the copy registers: 128 keys fit 4 blocks/SM (127 regs)
    {16, 4, false, 64, 4},    // an fp32 bias tile of 128 keys loses (1.52 against 1.23 ms)
    {16, 4, true, 64, 4},     // likewise with TMA
    {32, 2, false, 128, 0},   // 128 keys halve the per-tile fixed work for 64 S registers
    {32, 2, true, 128, 0},    // likewise with TMA
    {32, 4, false, 64, 0},    // fp32 bias tiles of 128 keys (32 KB a stage) leave 2 blocks/SM
    {32, 4, true, 64, 0},     // likewise with TMA (1.31 against 1.53 ms)
    {64, 2, false, 64, 0},    // S stays at 32 registers next to the larger O accumulator
    {64, 2, true, 64, 3},     // 3 blocks/SM: the compiler's choice would be 2
    {64, 4, false, 64, 0},    // as the 16-bit bias
    {64, 4, true, 64, 3},     // the compiler would take 174 registers (2 blocks/SM); 168 fit
    {128, 2, false, 64, 0},   // O's 64 accumulators leave room for 32 S registers only
    {128, 4, false, 64, 0},   // as the 16-bit bias (no TMA: 256-byte rows need two boxes)
};

constexpr FwdTile fwd_tile(int D, int bias_bytes, bool tma) {
  for (const FwdTile& t : kFwdTiles)
    if (t.head_dim == D && t.bias_bytes == bias_bytes && t.tma == tma) return t;
  return {0, 0, false, 0, -1};  // not a shipped kernel: FwdConfig's static_assert names it
}

template <int D, int kBiasBytes, bool kTma = false>
struct FwdConfig {
  static constexpr FwdTile kTile = fwd_tile(D, kBiasBytes, kTma);
  static_assert(kTile.block_k > 0, "no row of kFwdTiles for this head dim, bias dtype and load");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockQ = 16 * kWarps;  // 64
  static constexpr int kBlockK = kTile.block_k;
  static constexpr int kStages = 2;
  static constexpr int kMinBlocks = kTile.min_blocks;
};

// Backward (key-tile parallel): one block owns a 64-key tile of one (b, h) and walks query
// tiles. A "quad" of 4 warps computes one slice (each warp 16 keys); kSlices quads run on
// consecutive slices and share one bias tile and one dbias read-modify-write. One more
// warpgroup, the helper, does the reductions: two warps the dbias partial, two the dQ adds in
// key-tile order.
struct BwdTile {
  int head_dim;
  int block_q;    // query rows per step: S^T and dP^T take block_q / 2 registers each
  int slices;     // quads per block
  int wgmma;      // 0: mma.sync; 1: wgmma for S^T, dP^T, dV and dK (each quad one warpgroup)
  int dq_stages;  // dQ part buffers between the math and the dQ warps (2 or 3)
};
inline constexpr BwdTile kBwdTiles[] = {
    // D  BQ  slices  wgmma  dQ stages
    {16, 64, 2, 0, 3},   // as D = 32 (32-row steps no longer build: the copies pass 64 rows)
    {32, 64, 2, 1, 3},   // 2 quads x 64 rows beat 4 x 32 (spills) and 1 quad; wgmma reads once
    {64, 32, 2, 0, 3},   // dK, dV of 16 keys x 64 in registers leave room for 32-row steps
    {128, 32, 1, 0, 2},  // one quad fills the registers; a third 16 KB dQ stage measured slower
};

constexpr BwdTile bwd_tile(int D) {
  for (const BwdTile& t : kBwdTiles)
    if (t.head_dim == D) return t;
  return {0, 0, 0, 0, 0};
}

template <int D>
struct BwdConfig {
  static constexpr BwdTile kTile = bwd_tile(D);
  static_assert(kTile.block_q > 0, "no row of kBwdTiles for this head dim");
  static constexpr int kBlockK = 64;
  static constexpr int kBlockQ = kTile.block_q;
  static constexpr int kSlices = kTile.slices;
  static constexpr int kWgmma = kTile.wgmma;
  static constexpr int kDqStages = kTile.dq_stages;
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
  static constexpr int kHelperRegs = 96;  // the least at which the helper's dQ warps do not spill
  static constexpr int kMathRegs =
      ((kLaunchRegs * kThreads - kHelperRegs * kHelperThreads) / kMathThreads) / 8 * 8;
  static_assert(!kSplitRegs || (kMathRegs <= 256 && kHelperRegs >= 24), "setmaxnreg range");
};

// The two-pass backward (two_pass.cu; D = 32 with a 16-bit bias loadable by TMA): 128-key x
// 128-query tiles, two math warpgroups of 64 keys (S^T, dP^T on m64n128k16: 64 + 64
// accumulators a thread, beside dK, dV, dQ and the A fragments of P^T, dS^T), a third warpgroup
// for the loads and the reductions. Pass 1 (dQ, dK, dV) and pass 2 (dbias) walk the slices of a
// chunk. Registers: the launch's pool is 168 x 384 (__launch_bounds__), which setmaxnreg splits
// as 224 x 256 + 56 x 128 (the dQ warps' adds are bulk copies: they hold no data).
struct TwoPassTile {
  static constexpr int kBlockK = 128, kBlockQ = 128;
  static constexpr int kMathThreads = 256, kThreads = 384;
  static constexpr int kMathRegs = 224, kHelperRegs = 56;
  static_assert(kMathRegs * kMathThreads + kHelperRegs * (kThreads - kMathThreads) <= 168 * kThreads,
                "setmaxnreg takes registers from the launch's pool");
};

// dQ turn chains: at D = 32 with 2 to kBwdShortChainTiles key tiles, two interleaved chains
// (key tile kb in chain kb % 2, summed in chain order by dq_finalize) shorten the turn lag; at
// N = 768 the second accumulator meets a full L2 and one chain wins.
constexpr int kBwdShortChainTiles = 10;
constexpr int bwd_dq_chains(int head_dim, int key_tiles) {
  return head_dim == 32 && key_tiles >= 2 && key_tiles <= kBwdShortChainTiles ? 2 : 1;
}

// Blocks the backward aims to launch: 4 waves of 132 SMs bound the tail of the last wave to
// a quarter. It fixes how slices are cut into chunks (and so the dbias partial count), so it
// is a constant of the library, not read from the device: results stay bitwise identical on
// any GPU.
constexpr int kBwdTargetBlocks = 4 * 132;

}  // namespace tpf::attn
