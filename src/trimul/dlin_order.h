// Column orders of the input projection's a/b part (host and device).
//
// wcat (the forward's folded input weight) comes in groups of 128 rows: the 64 projection rows
// of channels 64q .. 64q + 63 of [a | b], then their 64 gate rows (epilogues.cuh).
//
// The projection backward's register epilogue (ProjectBackwardEpilogue) needs a channel's
// projection and gate logits in one thread: its B operand, wcat_pg, interleaves them (row
// 128q + 2i + e holds channel 64q + i, e = 0 projection, 1 gate). An mma.sync thread then holds,
// for each of its rows, 8 values that dlin stores as one 16-byte vector: dlin's a/b columns
// come in the order of those vectors. Column j = 128q + 32w + 8t + 2n + e of dlin is written by
// warp column w, quad lane t, n8 tile n (GemmConfig: 4 warps of 32 columns along N, m16n8
// fragments), and holds channel 64q + 16w + 4n + t, projection (e = 0) or gate (e = 1).
// dlin's other consumers follow that order: the d xhat_in product's weight rows (wcat_raw),
// G_in's and the column sums' columns (finalize). The output-gate columns keep theirs.
#pragma once
#include <cstdint>

#include "trimul/layout.h"
#include "trimul/tile_config.h"

namespace tpf::trimul {

static_assert(GemmConfig::kBlockN == 128 && GemmConfig::kWarpsN == 4 && GemmConfig::kWarpTileN == 32,
              "dlin's a/b column order follows the mma.sync warp tiling of the projection backward");

// wcat row (forward order) of dlin's a/b column j (j < 4Ch).
TPF_HD inline int64_t wcat_row_of_dlin_col(int64_t j) {
  const int64_t q = j / 128;
  const int jj = static_cast<int>(j % 128);
  const int e = jj & 1, n = (jj >> 1) & 3, t = (jj >> 3) & 3, w = jj >> 5;
  return q * 128 + e * 64 + 16 * w + 4 * n + t;
}

// dlin column of wcat row o (o < 4Ch); the inverse of wcat_row_of_dlin_col.
TPF_HD inline int64_t dlin_col_of_wcat_row(int64_t o) {
  const int64_t q = o / 128;
  const int oo = static_cast<int>(o % 128);
  const int e = oo >> 6, i = oo & 63;
  const int w = i >> 4, n = (i >> 2) & 3, t = i & 3;
  return q * 128 + 32 * w + 8 * t + 2 * n + e;
}

// wcat_pg row of wcat row o (o < 4Ch): the channel's projection and gate rows side by side.
TPF_HD inline int64_t pg_row_of_wcat_row(int64_t o) {
  const int64_t q = o / 128;
  const int oo = static_cast<int>(o % 128);
  return q * 128 + 2 * (oo & 63) + (oo >> 6);
}

// The column of G_in and of the column sums that belong to wcat row o (any of the P rows).
TPF_HD inline int64_t dlin_col(int64_t o, int64_t Ch) { return o < 4 * Ch ? dlin_col_of_wcat_row(o) : o; }

}  // namespace tpf::trimul
