// Column orders of the input projection's a/b part (host and device).
//
// wcat (the folded input weight [4Ch + C][C]) comes in groups of 128 rows, one per 64 channels
// of [a | b]: row 128q + 2i + e holds channel 64q + i's projection (e = 0) or gate (e = 1), so
// that both logits of a channel land in one thread's mma.sync C fragment (columns 2t, 2t + 1)
// and the projection epilogues work from registers; the C output-gate rows follow.
//
// dlin (the projection's gradient, pixel-major) stores each thread's 8 values of a row as one
// 16-byte vector: thread (g, t) of the warp at tile column 32w holds n8 tiles n = 0..3, i.e.
// wcat rows 128q + 32w + 8n + 2t + e, and writes them at dlin columns 128q + 32w + 8t + 2n + e.
// The order swaps the 2-bit fields n and t of the column (its own inverse). dlin's other
// consumers follow it: the d xhat_in product's weight rows (wcat_raw), G_in's and the column
// sums' columns (finalize). The output-gate columns keep wcat's order.
#pragma once
#include <cstdint>

#include "trimul/layout.h"
#include "trimul/tile_config.h"

namespace tpf::trimul {

static_assert(GemmConfig::kBlockN == 128 && GemmConfig::kWarpsN == 4 && GemmConfig::kWarpTileN == 32,
              "dlin's a/b column order follows the mma.sync warp tiling of the projection epilogues");

// dlin column of wcat row o (o < 4Ch), and the wcat row of dlin column o: the same swap.
TPF_HD inline int64_t swap_fragment_fields(int64_t o) {
  const int64_t n = (o >> 3) & 3, t = (o >> 1) & 3;
  return (o & ~int64_t{0x1e}) | (t << 3) | (n << 1);
}

// The column of dlin, G_in and the column sums that belong to wcat row o (any of the P rows).
TPF_HD inline int64_t dlin_col(int64_t o, int64_t Ch) { return o < 4 * Ch ? swap_fragment_fields(o) : o; }

}  // namespace tpf::trimul
