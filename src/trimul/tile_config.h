// Tile configuration of the multiplicative-update kernels: the one place their sizes live.
#pragma once

namespace tpf::trimul {

struct GemmConfig {
  // 128 x 128 output tiles: the projections have N = 4Ch + C = 640 columns and the triangle
  // product N x N per channel, so 128 keeps edge waste small at N >= 384 while a block's
  // 16 KB of operands per k-step amortise the epilogue's pass through shared memory.
  static constexpr int kBlockM = 128, kBlockN = 128;
  // k-step of 64 (128-byte rows of the K-major tiles): half the barriers of a 32 step on the
  // long-K triangle product, and K = C = 128 (the common width) takes two steps. Widths that are
  // not multiples of 64 (32, 96) zero-fill the last step.
  static constexpr int kBlockK = 64;
  // 8 warps as 2 (m) x 4 (n): each warp owns a 64 x 32 accumulator (64 fp32 registers), which
  // leaves room for two blocks per SM at <= 128 registers per thread.
  static constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpTileM = kBlockM / kWarpsM, kWarpTileN = kBlockN / kWarpsN;
  // Three cp.async stages hide global latency for the long-K triangle product (K = N): 96 KB,
  // two blocks per SM (registers allow two anyway).
  static constexpr int kStages = 3;
  // The epilogue stages the fp32 accumulator tile in shared memory with rows padded by one
  // float: column walks (channel-major stores) and row walks are then both conflict-free.
  static constexpr int kEpiStride = kBlockN + 1;
  // Channel-major staging ([n][r], for epilogues that store channel-major 8 pixels at a time):
  // rows of 132 floats are 16-byte aligned for vector reads, and the 4-bank shift per column
  // keeps the accumulator writes conflict-free (lane (g, t) lands in bank 8t + g).
  static constexpr int kEpiStrideCm = kBlockM + 4;
  // Shared memory past the staged tile for an epilogue's second operand: the fused LayerNorm_out
  // backward stages x's 128 channels x 128 pixels in bf16 there (32 KB; the tile and it then
  // take 99 KB of the block's ~101 KB, still two blocks per SM).
  static constexpr int kEpiExtraBytes = kBlockN * kBlockM * 2;
};

// The TMA loop (gemm_tma.cuh): one persistent block per SM, a producer warp issuing TMA copies
// into a ring of stages and consumer warpgroups of 64 rows each (64-wide k-steps). Each use
// picks its tile width, stages and consumers, and the setmaxnreg split: the producer's
// warpgroup gives up registers to the consumers, within what the launch allocated.
struct TmaLoopConfig {
  static constexpr int kBlockK = 64;
};
// The triangle products (K = N, the op's cubic work): 128 x 256 tiles, four 48 KB stages, two
// consumers with 128 accumulators each (40 x 128 + 232 x 256 registers). At 128 x 128 the
// products read ~1.8 GB from L2 at N = 768 and ran at L2's pace; 256 columns cut that by a
// quarter, and four stages keep three k-steps in flight.
struct ProductTile {
  static constexpr int kBlockN = 256, kStages = 4, kConsumers = 2, kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr bool kSplitK = false;
};
// The weight gradients on the TMA loop (K = pixels in split-K chunks, both operands MN-major):
// their products are L2-bound on 128 x 128 tiles (each chunk's operand rows read once per tile
// they meet: ~7 KB a pixel for dW_in's two at C = Ch = 128), so the tiles span the whole of the
// wider output side. Wide: 256 x 128 (2C = 256 rows of dW_inᵀ's high/low product and dWz), four
// consumers as the projection's (24 x 128 + 112 x 512 registers), four 48 KB stages: the partials
// go out from registers (gemm_tma.cuh's RegisterStoreEpilogue, once per ~180 k-steps), and the
// store slots' shared memory keeps a fourth k-step in flight (at 1.45 us a k-step with three, the
// SMs drew ~4.4 TB/s from L2 and DRAM gave ~2.3: neither at its ceiling); narrow: 128 x 256
// (the C = 128 rows of the low-part product), the products' shape, with the TMA store slots.
struct WgradWideTile {
  static constexpr int kBlockN = 128, kStages = 4, kConsumers = 4, kProducerRegs = 24, kConsumerRegs = 112;
  static constexpr bool kSplitK = true, kRegisterStores = true;
};
struct WgradNarrowTile {
  static constexpr int kBlockN = 256, kStages = 4, kConsumers = 2, kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr bool kSplitK = true, kRegisterStores = false;
};
// The input projection (K = C, two k-steps): 256 x 128 tiles (64 channels' both logits, or 128
// output-gate channels), three 48 KB stages, four consumers: its a/b epilogue (two MUFU a value,
// a transpose, the channel-major stores) is bound by latency, which 16 warps hide better than 8. The launch
// allocates 96 registers a thread (65536 / 640, rounded down to 8): 24 x 128 + 112 x 512 fits.
struct ProjectTile {
  static constexpr int kBlockN = 128, kStages = 3, kConsumers = 4, kProducerRegs = 24, kConsumerRegs = 112;
};

// The fused backward tail (tail.cu): 128-pixel row tiles, 64 rows a consumer warpgroup (one
// m64 wgmma row block each), so that a block's x̂, weight, dlin and da tiles fit its 224 KB of
// shared memory once; two consumers with 64 + 64 accumulators ([p | g] and d x̂) beside the
// epilogue's values (40 x 128 + 232 x 256 registers); a/b column tiles of 128 (64 channels' p and
// g), at most four (Ch <= 128) so that their column totals stay in registers until the tile ends.
struct TailTile {
  static constexpr int kRows = 128, kConsumers = 2, kProducerRegs = 40, kConsumerRegs = 232, kMaxColTiles = 4;
  static constexpr int kThreads = 128 * (kConsumers + 1);
};

// The long-K products (4+ k-steps: weight gradients, K = B N^2 in split-K chunks; the d xhat
// products; the triangle products where the TMA loop cannot take them) run on wgmma
// (gemm_wgmma.cuh); false: on
// the mma.sync main loop like the short-K products whose epilogues prefetch an operand.
constexpr bool kLongKWgmma = true;

// Weight-gradient products (dW = dYᵀ X over B·N² rows) are split along the rows into chunks of
// this many rows so that ~4 waves of blocks cover the few output tiles; partials are then
// summed in chunk order (bitwise deterministic, no atomics).
constexpr int kWgradTargetBlocks = 528;  // 4 x 132 SMs
constexpr int kWgradMinRows = 1024;      // below this a chunk's epilogue would dominate
// The low-memory backward's dWz chunks: twice as long, so that at N <= 384 (where 1024 rows give
// ~150 chunks for its two output tiles) its partials take half the ~19 MB; it runs beside
// d x̂_out, so the fewer, longer blocks cost no wall time there.
constexpr int kWgradMinRowsLowMemory = 2048;

// The low-memory backward's tail (input projection backward, d xhat_in with LayerNorm_in's
// backward and dW_in) runs over about this many chunks of pixel rows, each a whole number of
// dW_in's split-K chunks, so that dlin ((P + 4Ch) bf16 a pixel, 2.3 KB at C = Ch = 128, the
// workspace's largest buffer) is held for one chunk at a time instead of all N² pixels.
constexpr int kTailChunks = 8;

// Row kernels (LayerNorm forward/backward): one warp per row of <= 256 channels; 8 warps per
// block. Channel-major inputs are transposed through shared memory 32 pixels at a time.
constexpr int kRowWarps = 8;
constexpr int kColPixels = 32;

}  // namespace tpf::trimul
