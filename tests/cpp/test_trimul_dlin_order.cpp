// dlin's a/b column order (dlin_order.h, CPU): a permutation of each 128-column group, the
// inverse of its own inverse, and the columns the projection backward's register epilogue
// writes: thread (g, t) of warp column w stores the values of n8 tiles n = 0..3 (each the
// channel's projection then gate, B-operand columns 2i and 2i + 1 of wcat_pg) as one 16-byte
// group at column 32w + 8t.
#include <gtest/gtest.h>

#include <set>

#include "trimul/dlin_order.h"

namespace tpf::trimul {
namespace {

TEST(TrimulDlinOrder, PermutesEachGroupAndInverts) {
  for (const int64_t Ch : {32, 96, 128, 256}) {
    std::set<int64_t> seen;
    for (int64_t o = 0; o < 4 * Ch; ++o) {
      const int64_t j = dlin_col_of_wcat_row(o);
      EXPECT_EQ(j / 128, o / 128) << "stays in its 128-column group";
      EXPECT_EQ(wcat_row_of_dlin_col(j), o);
      EXPECT_EQ(dlin_col(o, Ch), j);
      seen.insert(j);
      const int64_t pg = pg_row_of_wcat_row(o);
      EXPECT_EQ(pg / 128, o / 128);
      EXPECT_EQ(pg % 2, (o % 128) / 64) << "projection rows even, gate rows odd";
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 4 * Ch);
    for (int64_t o = 4 * Ch; o < 4 * Ch + 64; ++o) EXPECT_EQ(dlin_col(o, Ch), o) << "output-gate columns";
  }
}

TEST(TrimulDlinOrder, MatchesTheRegisterEpilogue) {
  for (int q = 0; q < 3; ++q)
    for (int w = 0; w < GemmConfig::kWarpsN; ++w)
      for (int t = 0; t < 4; ++t)
        for (int n = 0; n < GemmConfig::kWarpTileN / 8; ++n)
          for (int e = 0; e < 2; ++e) {
            // B-operand column of the fragment: warp column w, n8 tile n, quad lane t, half e
            const int64_t b_col = q * 128 + w * GemmConfig::kWarpTileN + 8 * n + 2 * t + e;
            const int64_t stored = q * 128 + 32 * w + 8 * t + 2 * n + e;
            EXPECT_EQ(pg_row_of_wcat_row(wcat_row_of_dlin_col(stored)), b_col);
          }
}

}  // namespace
}  // namespace tpf::trimul
