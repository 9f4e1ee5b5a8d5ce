// The multiplicative update's workspace layout (CPU): alignment, bounds, and that buffers which
// are live at the same time never share bytes (only the documented overlays may).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trimul/workspace.h"

namespace tpf::trimul {
namespace {

struct Buf {
  std::string name;
  const void* ptr;
  int64_t bytes;
};

std::vector<Buf> buffers(const Workspace& w, const Dims& d, bool backward) {
  const int64_t M = d.M(), P = d.proj_cols(), cm = d.cm_elems(), mt = (M + 127) / 128;
  std::vector<Buf> b = {{"wcat", w.wcat, P * d.C * 2}, {"bcat", w.bcat, P * 4},
                        {"wz", w.wz, d.C * d.Ch * 2},  {"bz", w.bz, d.C * 4},
                        {"xhat_in", w.xhat_in, M * d.C * 2}, {"a", w.a, cm * 2},
                        {"b", w.b, cm * 2},            {"gate", w.gate, M * d.C * 2},
                        {"x", w.x, cm * 2},            {"xhat_out", w.xhat_out, M * d.Ch * 2}};
  if (!backward) return b;
  const std::vector<Buf> more = {
      {"wcat_raw", w.wcat_raw, P * d.C * 2}, {"wz_raw", w.wz_raw, 2 * d.C * d.Ch * 2},
      {"xhat_in_bf", w.xhat_in_bf, M * d.C * 2}, {"xhat_out_bf", w.xhat_out_bf, M * d.Ch * 2},
      {"mean_in", w.mean_in, M * 4}, {"rstd_in", w.rstd_in, M * 4}, {"mean_out", w.mean_out, M * 4},
      {"rstd_out", w.rstd_out, M * 4}, {"dy", w.dy, M * 2 * d.C * 2}, {"dlin", w.dlin, M * P * 2},
      {"dxhat", w.dxhat, M * std::max(d.C, d.Ch) * 4}, {"dx", w.dx, cm * 2}, {"da", w.da, cm * 4},
      {"db", w.db, cm * 4}, {"colsum_dy", w.colsum_dy, mt * d.C * 4},
      {"colsum_lin", w.colsum_lin, mt * P * 4},
      {"part_in", w.part_in, w.split_in.parts * P * d.C * 4},
      {"part_out", w.part_out, w.split_out.parts * 2 * d.C * d.Ch * 4}, {"g_in", w.g_in, P * d.C * 4},
      {"g_out", w.g_out, d.C * d.Ch * 4}, {"s_in", w.s_in, P * 4}, {"s_out", w.s_out, d.C * 4}};
  b.insert(b.end(), more.begin(), more.end());
  return b;
}

// The overlays backward.cu's stage order allows (workspace.h): da over the gate and xhat_out,
// db over x and d xhat.
bool may_share(const std::string& p, const std::string& q) {
  auto pair = [&](const char* a, const char* b) { return (p == a && q == b) || (p == b && q == a); };
  return pair("da", "gate") || pair("da", "xhat_out") || pair("db", "x") || pair("db", "dxhat");
}

class TrimulWorkspace : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t>> {};

TEST_P(TrimulWorkspace, AlignedInBoundsAndDisjoint) {
  const auto [B, N, C, Ch] = GetParam();
  const Dims d{B, N, (N + 7) / 8 * 8, C, Ch};
  for (bool backward : {false, true}) {
    const size_t bytes = plan_workspace(d, backward, nullptr).bytes;
    auto* base = reinterpret_cast<uint8_t*>(uintptr_t{1} << 40);  // never dereferenced
    const Workspace w = plan_workspace(d, backward, base);
    EXPECT_EQ(w.bytes, bytes);
    const auto bufs = buffers(w, d, backward);
    for (const Buf& x : bufs) {
      const auto* p = static_cast<const uint8_t*>(x.ptr);
      ASSERT_NE(p, nullptr) << x.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << x.name;
      EXPECT_GE(p, base) << x.name;
      EXPECT_LE(p + x.bytes, base + bytes) << x.name << " ends past the workspace";
    }
    for (size_t i = 0; i < bufs.size(); ++i)
      for (size_t j = i + 1; j < bufs.size(); ++j) {
        if (bufs[i].ptr == bufs[j].ptr && !backward && bufs[i].name + bufs[j].name == "xhat_inxhat_out")
          continue;  // forward: xhat_out reuses xhat_in (dead by then)
        if (backward && may_share(bufs[i].name, bufs[j].name)) continue;
        const auto *a = static_cast<const uint8_t*>(bufs[i].ptr), *b = static_cast<const uint8_t*>(bufs[j].ptr);
        const bool disjoint = a + bufs[i].bytes <= b || b + bufs[j].bytes <= a;
        EXPECT_TRUE(disjoint) << bufs[i].name << " overlaps " << bufs[j].name
                              << (backward ? " (backward)" : " (forward)");
      }
    if (backward) {  // the split-K chunks cover every pixel row once, in k-step multiples
      for (const WgradSplit& s : {w.split_in, w.split_out}) {
        EXPECT_EQ(s.chunk % GemmConfig::kBlockK, 0);
        EXPECT_GE(s.chunk * s.parts, d.M());
        EXPECT_LT((s.parts - 1) * s.chunk, d.M());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TrimulWorkspace,
                         ::testing::Values(std::make_tuple(1, 1, 32, 32), std::make_tuple(1, 7, 64, 256),
                                           std::make_tuple(2, 100, 256, 32), std::make_tuple(1, 333, 96, 96),
                                           std::make_tuple(1, 768, 128, 128),
                                           std::make_tuple(1, 3072, 128, 128)));

}  // namespace
}  // namespace tpf::trimul
