// dlin's a/b column order (dlin_order.h, CPU): a permutation of each 128-column group that is
// its own inverse, and the columns the projection backward's register epilogue writes: thread
// (g, t) of warp column w stores its n8 tiles n = 0..3 (wcat rows 32w + 8n + 2t + e, a
// channel's projection then gate) as one 16-byte group at column 32w + 8t.
#include <gtest/gtest.h>

#include <set>

#include "trimul/dlin_order.h"

namespace tpf::trimul {
namespace {

TEST(TrimulDlinOrder, PermutesEachGroupAndIsItsOwnInverse) {
  for (const int64_t Ch : {32, 96, 128, 256}) {
    std::set<int64_t> seen;
    for (int64_t o = 0; o < 4 * Ch; ++o) {
      const int64_t j = dlin_col(o, Ch);
      EXPECT_EQ(j / 32, o / 32) << "stays in its warp's 32-column strip";
      EXPECT_EQ(j % 2, o % 2) << "projection and gate columns keep their parity";
      EXPECT_EQ(dlin_col(j, Ch), o);
      seen.insert(j);
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
            const int64_t b_col = q * 128 + w * GemmConfig::kWarpTileN + 8 * n + 2 * t + e;  // fragment's wcat row
            const int64_t stored = q * 128 + 32 * w + 8 * t + 2 * n + e;                     // its 16-byte group slot
            EXPECT_EQ(dlin_col(b_col, 96 * 4), stored);
          }
}

}  // namespace
}  // namespace tpf::trimul
