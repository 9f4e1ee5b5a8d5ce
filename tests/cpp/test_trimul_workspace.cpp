// The multiplicative update's workspace layout (CPU): alignment, bounds, and that buffers which
// are live at the same time never share bytes (only the documented overlays may, and in the
// recomputing backward's overlay plan only buffers whose lives in backward.cu's order are
// disjoint).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "trimul/workspace.h"

namespace tpf::trimul {
namespace {

struct Buf {
  std::string name;
  const void* ptr;
  int64_t bytes;
  bool saved;  // a member of the saved set
};

enum class Plan { kForward, kForwardSaving, kBackwardRecompute, kBackwardFromSaved };
bool is_backward(Plan p) { return p == Plan::kBackwardRecompute || p == Plan::kBackwardFromSaved; }
bool external_saved(Plan p) { return p == Plan::kForwardSaving || p == Plan::kBackwardFromSaved; }

std::vector<Buf> buffers(const Workspace& w, const Dims& d, Plan plan) {
  const int64_t M = d.M(), P = d.proj_cols(), cm = d.cm_elems(), mt = (M + 127) / 128;
  std::vector<Buf> b = {{"wcat", w.wcat, P * d.C * 2, false}, {"bcat", w.bcat, P * 4, false},
                        {"wz", w.wz, d.C * d.Ch * 2, false},  {"bz", w.bz, d.C * 4, false}};
  const std::vector<Buf> saved = {
      {"xhat_in", w.xhat_in, M * d.C * 2, true},      {"xhat_in_bf", w.xhat_in_bf, M * 2 * d.C * 2, true},
      {"mean_in", w.mean_in, M * 4, true},            {"rstd_in", w.rstd_in, M * 4, true},
      {"a_bf", w.a_bf, cm * 2, true},                 {"b_bf", w.b_bf, cm * 2, true},
      {"logit", w.logit, M * d.C * 2, true},          {"x", w.x, cm * 2, true},
      {"xhat_out", w.xhat_out, M * d.Ch * 2, true},   {"xhat_out_bf", w.xhat_out_bf, M * d.Ch * 2, true},
      {"mean_out", w.mean_out, M * 4, true},          {"rstd_out", w.rstd_out, M * 4, true}};
  if (plan == Plan::kForward) {
    const std::vector<Buf> more = {{"a", w.a, cm * 2, false}, {"b", w.b, cm * 2, false},
                                   {"gate", w.gate, M * d.C * 2, false}, {"xhat_in", w.xhat_in, M * d.C * 2, false},
                                   {"x", w.x, cm * 2, false}, {"xhat_out", w.xhat_out, M * d.Ch * 2, false}};
    b.insert(b.end(), more.begin(), more.end());
    return b;
  }
  b.insert(b.end(), saved.begin(), saved.end());
  if (plan == Plan::kForwardSaving) {
    const std::vector<Buf> more = {{"a", w.a, cm * 2, false}, {"b", w.b, cm * 2, false},
                                   {"gate", w.gate, M * d.C * 2, false}};
    b.insert(b.end(), more.begin(), more.end());
    return b;
  }
  const std::vector<Buf> more = {
      {"wcat_raw", w.wcat_raw, (P + 4 * d.Ch) * d.C * 2, false}, {"wz_raw", w.wz_raw, 2 * d.C * d.Ch * 2, false},
      {"dy", w.dy, M * 2 * d.C * 2, false}, {"dlin", w.dlin, w.tail_rows * d.dlin_cols() * 2, false},
      {"dxhat", w.dxhat, M * std::max(d.C, d.Ch) * 4, false}, {"dx", w.dx, cm * 2, false},
      {"da", w.da, cm * 4, false}, {"db", w.db, cm * 4, false},
      {"colsum_dy", w.colsum_dy, mt * d.C * 4, false}, {"colsum_lin", w.colsum_lin, mt * P * 4, false},
      {"part_in", w.part_in, w.tail_parts * 2 * d.C * P * 4, false},
      {"part_in_lo", w.part_in_lo, w.tail_parts * d.C * 4 * d.Ch * 4, false},
      {"part_out", w.part_out, w.split_out.parts * 2 * d.C * d.Ch * 4, false},
      {"g_in", w.g_in, P * d.C * 4, false},
      {"g_in_lo", w.g_in_lo, 4 * d.Ch * d.C * 4, false}, {"g_out", w.g_out, d.C * d.Ch * 4, false},
      {"s_in", w.s_in, P * 4, false}, {"s_out", w.s_out, d.C * 4, false},
      {"norm_in_part", w.norm_in_part, mt * 2 * d.C * 4, false},
      {"norm_out_part", w.norm_out_part, mt * 2 * d.Ch * 4, false},
      {"norm_in", w.norm_in, 2 * d.C * 4, false}, {"norm_out", w.norm_out, 2 * d.Ch * 4, false}};
  b.insert(b.end(), more.begin(), more.end());
  if (w.dgate) b.push_back({"dgate", w.dgate, M * d.C * 2, false});
  if (w.xhat_per_chunk) {  // both LayerNorm backwards fused: no d xhat buffer; x̂_in's pair per tail chunk
    b.erase(std::remove_if(b.begin(), b.end(),
                           [](const Buf& x) { return x.name == "dxhat" || x.name == "xhat_in_bf"; }),
            b.end());
    b.push_back({"tail_xhat", w.tail_xhat, w.tail_rows * d.C * 2, false});
    b.push_back({"tail_xhat_bf", w.tail_xhat_bf, w.tail_rows * 2 * d.C * 2, false});
  }
  return b;
}

// The recomputing backward's stages (backward.cu, workspace.h's plan_recompute): 0 LayerNorm_in,
// 1 the projection, 2 the triangle product, 3 LayerNorm_out, 4 the output stage, 5 d xhat_out
// with LayerNorm_out's backward beside dWz, 6 da beside db, 7 the tail's chunks (each LayerNorm_in
// of its rows, the tail, dW_in beside it), 8 the partials' sums. A buffer's life: the stages from
// its first write to its last read (bits).
unsigned life(const std::string& n) {
  auto span = [](int first, int last) { return ((2u << last) - 1) & ~((1u << first) - 1); };
  if (n == "xhat_in") return span(0, 1);  // the projection; the tail reads its own copies
  if (n == "mean_in" || n == "rstd_in") return span(0, 7);
  if (n == "a_bf" || n == "b_bf") return span(1, 6);
  if (n == "logit") return span(1, 4);
  if (n == "x") return span(2, 5);
  if (n == "xhat_out") return span(3, 4);
  if (n == "xhat_out_bf" || n == "mean_out" || n == "rstd_out") return span(3, 5);
  if (n == "dy") return span(4, 5);
  if (n == "dgate") return span(4, 7);
  if (n == "dx") return span(5, 6);
  if (n == "da" || n == "db") return span(6, 7);
  if (n == "dlin" || n == "tail_xhat" || n == "tail_xhat_bf") return span(7, 7);
  return span(0, 8);  // weights, column sums, partials, their sums
}

// The overlays the stage orders allow (workspace.h): the forward's xhat_out over xhat_in; the
// backward's da over d xhat, db over dy; in the recomputing backward's plan, buffers whose lives
// are disjoint, and the gate logit's gradient over the logit itself (the output stage reads each
// logit before it writes the gradient at its place: the one buffer pair that shares a stage).
bool may_share(Plan plan, const Workspace& w, const std::string& p, const std::string& q) {
  auto pair = [&](const char* a, const char* b) { return (p == a && q == b) || (p == b && q == a); };
  if (w.xhat_per_chunk) return (life(p) & life(q)) == 0 || pair("logit", "dgate");
  if (plan == Plan::kForward) return pair("xhat_in", "xhat_out");
  return is_backward(plan) && (pair("da", "dxhat") || pair("db", "dy"));
}

Workspace plan_of(Plan plan, const Dims& d, void* base, void* saved) {
  switch (plan) {
    case Plan::kForward: return plan_forward(d, base, false, nullptr);
    case Plan::kForwardSaving: return plan_forward(d, base, true, saved);
    case Plan::kBackwardRecompute: return plan_backward(d, base, false, nullptr);
    default: return plan_backward(d, base, true, saved);
  }
}

class TrimulWorkspace : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t>> {};

TEST_P(TrimulWorkspace, AlignedInBoundsAndDisjoint) {
  const auto [B, N, C, Ch] = GetParam();
  const Dims d{B, N, (N + 7) / 8 * 8, C, Ch};
  const size_t saved_bytes = saved_size(d);
  for (Plan plan : {Plan::kForward, Plan::kForwardSaving, Plan::kBackwardRecompute, Plan::kBackwardFromSaved}) {
    const std::string mode = " (plan " + std::to_string(static_cast<int>(plan)) + ")";
    const size_t bytes = plan_of(plan, d, nullptr, nullptr).bytes;
    // never dereferenced; far apart so that a buffer in the wrong one shows
    auto* base = reinterpret_cast<uint8_t*>(uintptr_t{1} << 40);
    auto* sbase = reinterpret_cast<uint8_t*>(uintptr_t{1} << 44);
    const Workspace w = plan_of(plan, d, base, sbase);
    EXPECT_EQ(w.bytes, bytes) << mode;
    const auto bufs = buffers(w, d, plan);
    for (const Buf& x : bufs) {
      const auto* p = static_cast<const uint8_t*>(x.ptr);
      const bool outside = x.saved && external_saved(plan);
      const uint8_t* lo = outside ? sbase : base;
      const size_t size = outside ? saved_bytes : bytes;
      ASSERT_NE(p, nullptr) << x.name << mode;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << x.name << mode;
      EXPECT_GE(p, lo) << x.name << mode;
      EXPECT_LE(p + x.bytes, lo + size) << x.name << " ends past its buffer" << mode;
    }
    for (size_t i = 0; i < bufs.size(); ++i)
      for (size_t j = i + 1; j < bufs.size(); ++j) {
        if (may_share(plan, w, bufs[i].name, bufs[j].name)) continue;
        const auto *a = static_cast<const uint8_t*>(bufs[i].ptr), *b = static_cast<const uint8_t*>(bufs[j].ptr);
        const bool disjoint = a + bufs[i].bytes <= b || b + bufs[j].bytes <= a;
        EXPECT_TRUE(disjoint) << bufs[i].name << " overlaps " << bufs[j].name << mode;
      }
    if (plan == Plan::kForwardSaving) {  // buffers and zeroed gaps tile the saved set exactly
      int64_t covered = 0;
      for (const Buf& x : bufs) covered += x.saved ? x.bytes : 0;
      for (int g = 0; g < w.saved_gaps; ++g) {
        const auto* gp = static_cast<const uint8_t*>(w.saved_gap[g].ptr);
        covered += static_cast<int64_t>(w.saved_gap[g].bytes);
        for (const Buf& x : bufs) {
          if (!x.saved) continue;
          const auto* p = static_cast<const uint8_t*>(x.ptr);
          EXPECT_TRUE(gp + w.saved_gap[g].bytes <= p || p + x.bytes <= gp) << "gap overlaps " << x.name;
        }
      }
      EXPECT_EQ(covered, static_cast<int64_t>(saved_bytes)) << mode;
      EXPECT_EQ(w.saved_bytes, saved_bytes);
    }
    if (is_backward(plan)) {  // the split-K chunks cover every pixel row once, in row-tile multiples
      for (const WgradSplit& s : {w.split_in, w.split_in_lo, w.split_out}) {
        EXPECT_EQ(s.chunk % GemmConfig::kBlockM, 0);
        EXPECT_GE(s.chunk * s.parts, d.M());
        EXPECT_LT((s.parts - 1) * s.chunk, d.M());
      }
      // the tail's chunks: whole split-K chunks of both dW_in products (or every pixel), and
      // dgate exactly when dlin holds fewer rows than the pixels
      EXPECT_EQ(w.split_in_lo.chunk, w.split_in.chunk);
      EXPECT_TRUE(w.tail_rows == d.M() || w.tail_rows % w.split_in.chunk == 0);
      // dW_in's partials hold one tail chunk's split-K chunks (every one where the tail is whole)
      EXPECT_GE(w.tail_parts * w.split_in.chunk, w.tail_rows);
      EXPECT_LT((w.tail_parts - 1) * w.split_in.chunk, w.tail_rows);
      if (w.tail_rows == d.M()) EXPECT_EQ(w.tail_parts, w.split_in.parts);
      EXPECT_EQ(w.dgate != nullptr, w.tail_rows < d.M() || w.xhat_per_chunk);
      if (d.C > GemmConfig::kBlockN) EXPECT_EQ(w.tail_rows, d.M());
      // the overlays: only in the recomputing backward, where both LayerNorm backwards are fused
      if (w.xhat_per_chunk) EXPECT_TRUE(plan == Plan::kBackwardRecompute && fused_norm_in(d) && fused_norm_out(d));
    }
  }
}

// The weight gradients' split-K partials a plan holds: dW_in's high/low and low-part products
// for one tail chunk, dWz's for the whole product.
int64_t partial_bytes(const Workspace& w, const Dims& d) {
  return (w.tail_parts * (2 * d.C * d.proj_cols() + d.C * 4 * d.Ch) + w.split_out.parts * 2 * d.C * d.Ch) * 4;
}

// Saving moves the saved set out of the workspaces: each shrinks. The recomputing (low-memory)
// backward holds the saved set itself, and dlin for one chunk of the tail with dgate beside it.
TEST(TrimulWorkspaceSizes, SavedSetLeavesTheWorkspaces) {
  for (int64_t N : {7, 100}) {
    const Dims d{1, N, (N + 7) / 8 * 8, 128, 128};
    EXPECT_LT(plan_forward(d, nullptr, true, nullptr).bytes, plan_forward(d, nullptr, false, nullptr).bytes);
    const Workspace saving = plan_backward(d, nullptr, true, nullptr);
    const Workspace low = plan_backward(d, nullptr, false, nullptr);
    EXPECT_EQ(saving.tail_rows, d.M());
    const int64_t dgate = low.tail_rows < d.M() ? d.M() * d.C * 2 : 0;
    const int64_t dlin_saved = (d.M() - low.tail_rows) * d.dlin_cols() * 2 - dgate;
    // the low-memory plan's partials: dW_in's for one tail chunk, dWz's longer chunks
    EXPECT_LE(partial_bytes(low, d), partial_bytes(saving, d));
    EXPECT_NEAR(static_cast<double>(saving.bytes + saved_size(d)),
                static_cast<double>(low.bytes + dlin_saved + partial_bytes(saving, d) - partial_bytes(low, d)),
                3 * 256.0);  // alignment of the buffers around dlin and the partials
    if (N == 100) EXPECT_LT(low.tail_rows, d.M());
  }
}

// The low-memory backward's tail holds dlin for about 1/kTailChunks of the pixels at large N
// where the overlays do not apply (here N % 8 != 0: LayerNorm_out's backward is a row kernel):
// the workspace shrinks by most of dlin's (P + 4Ch) bf16 a pixel.
TEST(TrimulWorkspaceSizes, TailChunksHoldAFractionOfDlin) {
  const Dims d{1, 766, 768, 128, 128};
  ASSERT_FALSE(plan_backward(d, nullptr, false, nullptr).xhat_per_chunk);
  const Workspace w = plan_backward(d, nullptr, false, nullptr);
  EXPECT_LE(w.tail_rows * kTailChunks, d.M() + kTailChunks * w.split_in.chunk);
  EXPECT_LT(w.tail_rows, d.M() / 4);
  // it holds the saved set itself, and still needs less than the saving backward's workspace
  // plus the saved set by two thirds of a whole dlin
  const size_t full_dlin = static_cast<size_t>(d.M() * d.dlin_cols() * 2);
  EXPECT_LT(w.bytes + full_dlin * 2 / 3, plan_backward(d, nullptr, true, nullptr).bytes + saved_size(d));
}

// With the overlays (AF3's shapes: C = Ch = 128, N % 8 == 0) the recomputing backward needs
// 2064 bytes a pixel for its four regions and statistics (workspace.h: the output stage's live
// set), 256 less than the saved set, and under 200 more (weights, partials, column sums: 180 at
// N = 768, 45 at 4096), where the plan without them holds the saved set, d x̂/da, dy/db, dx, dgate
// and a chunk of dlin (~1.85 KB a pixel more); the tail then runs in at most 5 chunks (a chunk's
// dlin and x̂_in copies take 3 KB a row of R2's 768 bytes a pixel).
TEST(TrimulWorkspaceSizes, OverlaysHoldTheBackwardInItsLiveSet) {
  for (int64_t N : {768, 1024, 4096}) {
    const Dims d{1, N, N, 128, 128};
    const Workspace w = plan_backward(d, nullptr, false, nullptr);
    ASSERT_TRUE(w.xhat_per_chunk) << N;
    const int64_t M = d.M();
    EXPECT_GE(w.bytes, static_cast<size_t>(M * 2064)) << N;
    EXPECT_LT(w.bytes, saved_size(d) - M * 256 + M * 200) << N;
    EXPECT_LE((M + w.tail_rows - 1) / w.tail_rows, 5) << N;
    const Workspace old = plan_backward(Dims{1, N - 2, N, 128, 128}, nullptr, false, nullptr);
    EXPECT_GT(static_cast<double>(old.bytes) / (N - 2) / (N - 2) - static_cast<double>(w.bytes) / M, 1800.0) << N;
  }
}

// At small N the weight gradients' split-K partials are most of the low-memory backward's
// excess over its per-pixel bytes: dW_in's hold one tail chunk's (summed into the totals after
// each chunk), dWz's take chunks of kWgradMinRowsLowMemory rows: at N = 256 and 384 they are under
// a third of the saving backward's (~66 MB there).
TEST(TrimulWorkspaceSizes, LowMemoryPartialsAreAFraction) {
  for (int64_t N : {256, 384}) {
    const Dims d{1, N, N, 128, 128};
    const Workspace saving = plan_backward(d, nullptr, true, nullptr), low = plan_backward(d, nullptr, false, nullptr);
    EXPECT_GT(partial_bytes(saving, d), 3 * partial_bytes(low, d)) << N;
    EXPECT_LT(low.tail_parts, low.split_in.parts) << N;
    EXPECT_EQ(saving.tail_parts, saving.split_in.parts) << N;
  }
}

// The GPU tests' recomputing cases that exercise the overlays (test_gpu_trimul.cpp) take them.
TEST(TrimulWorkspaceSizes, GpuTestShapesTakeTheOverlays) {
  for (const Dims& d : {Dims{1, 80, 80, 128, 64}, Dims{2, 72, 72, 96, 96}, Dims{1, 104, 104, 128, 128}}) {
    const Workspace w = plan_backward(d, nullptr, false, nullptr);
    EXPECT_TRUE(w.xhat_per_chunk) << d.B << "x" << d.N << " C " << d.C << " Ch " << d.Ch;
    EXPECT_GT((d.M() + w.tail_rows - 1) / w.tail_rows, 1) << "the tail in more than one chunk";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TrimulWorkspace,
                         ::testing::Values(std::make_tuple(1, 1, 32, 32), std::make_tuple(1, 7, 64, 256),
                                           std::make_tuple(2, 100, 256, 32), std::make_tuple(1, 333, 96, 96),
                                           std::make_tuple(1, 768, 128, 128), std::make_tuple(2, 48, 128, 64),
                                           std::make_tuple(1, 1024, 96, 96),
                                           std::make_tuple(1, 3072, 128, 128)));

}  // namespace
}  // namespace tpf::trimul
