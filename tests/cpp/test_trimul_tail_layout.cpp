// The fused backward tail's index maps (trimul/tail_layout.h, CPU): its shared-memory tiles are
// bijections with the bank spread the kernel relies on, and the columns its register values are
// staged under agree with dlin's column order (dlin_order.h) and cover each column once.
#include <gtest/gtest.h>

#include <set>

#include "trimul/dlin_order.h"
#include "trimul/tail_layout.h"

namespace tpf::trimul::tail {
namespace {

TEST(TrimulTailLayout, ChunkMapIsABijectionOfTheTile) {
  std::set<uint32_t> seen;
  for (int row = 0; row < 64; ++row)
    for (int ch = 0; ch < 16; ++ch) {
      const uint32_t at = chunk_at(row, ch);
      EXPECT_EQ(at % 16, 0u);
      EXPECT_LT(at, 64u * 128 * 2);
      EXPECT_EQ(at / (64 * 128), static_cast<uint32_t>(ch / 8)) << "each 64-column half is its own [64][64] box";
      seen.insert(at);
    }
  EXPECT_EQ(seen.size(), 64u * 16);
}

TEST(TrimulTailLayout, DaTileIsABijectionAndAWarpsReadsHitEveryBank) {
  std::set<int> seen;
  for (int c = 0; c < 64; ++c)
    for (int r = 0; r < 64; ++r) seen.insert(da_index(c, r));
  EXPECT_EQ(seen.size(), 64u * 64);
  EXPECT_EQ(*seen.rbegin(), 64 * 64 - 1);
  // the epilogue's read: lane (g, t) of warp w takes channel 4i + t, pixel 16w + g + 8h
  for (int w = 0; w < 4; ++w)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 16; ++i) {
        std::set<int> banks;
        for (int lane = 0; lane < 32; ++lane) banks.insert(da_index(4 * i + lane % 4, 16 * w + lane / 4 + 8 * h) % 32);
        EXPECT_EQ(banks.size(), 32u) << "w " << w << " h " << h << " i " << i;
      }
}

TEST(TrimulTailLayout, ReduceScatterBasesPartitionTheValues) {
  for (const int n : {32, 64}) {
    std::set<int> seen;
    for (int g = 0; g < 8; ++g) {
      const int base = n == 32 ? scatter_base<32>(4 * g) : scatter_base<64>(4 * g);
      EXPECT_EQ(base % (n / 8), 0);
      for (int t = 1; t < 4; ++t)  // the quad's lanes keep the same indices (of their own columns)
        EXPECT_EQ(base, n == 32 ? scatter_base<32>(4 * g + t) : scatter_base<64>(4 * g + t));
      for (int j = 0; j < n / 8; ++j) seen.insert(base + j);
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  }
}

TEST(TrimulTailLayout, SumsColumnsFollowDlinOrder) {
  // thread t's value of channel pair i = 4k + n (natural column 8i + 2t + e) is sums index
  // 8k + 2n + e; its column must be where dlin stores that natural column
  std::set<int> seen;
  for (int t = 0; t < 4; ++t)
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(8 * (4 * k + t), sums_column(8 * k, t)) << "the 16-byte chunk 4k + t holds the group";
      for (int n = 0; n < 4; ++n)
        for (int e = 0; e < 2; ++e) {
          const int natural = 8 * (4 * k + n) + 2 * t + e, col = sums_column(8 * k + 2 * n + e, t);
          EXPECT_EQ(col, swap_fragment_fields(natural));
          seen.insert(col);
        }
    }
  EXPECT_EQ(seen.size(), 128u);
}

TEST(TrimulTailLayout, NormChannelsCoverTheRow) {
  std::set<int> seen;
  for (int t = 0; t < 4; ++t)
    for (int idx = 0; idx < 32; ++idx) seen.insert(norm_channel(idx, t));
  EXPECT_EQ(seen.size(), 128u);
  EXPECT_EQ(*seen.rbegin(), 127);
}

}  // namespace
}  // namespace tpf::trimul::tail
