// The FP64 reference of triangle attention: semantics (mask, bias sharing, fully masked rows),
// gradients by finite differences, layouts, and the compensated softmax correction.
#include <gtest/gtest.h>

#include "testing/attention_problem.h"
#include "testing/finite_diff.h"

namespace tpf::test {
namespace {

void run_fwd(AttnProblem& p) { ASSERT_TRUE(reference::attention_forward(p.fwd()).ok()); }

void run_bwd(AttnProblem& p) {
  run_fwd(p);
  ASSERT_TRUE(reference::attention_backward(p.bwd()).ok());
}

double loss(AttnProblem& p) {
  run_fwd(p);
  return harness::dot(p.out, p.dout);
}

void check_gradient(AttnProblem& p, HostTensor AttnProblem::*x, HostTensor AttnProblem::*dx) {
  run_bwd(p);
  EXPECT_LT(harness::finite_difference_error(p.*x, (p.*dx).values(), [&] { return loss(p); }), 1e-6);
}

TEST(ReferenceAttention, GradQByFiniteDifferences) {
  auto p = AttnProblem::random({1, 2, 2, 5, 4}, 1);
  check_gradient(p, &AttnProblem::q, &AttnProblem::dq);
}
TEST(ReferenceAttention, GradKByFiniteDifferences) {
  auto p = AttnProblem::random({1, 2, 2, 5, 4}, 2);
  check_gradient(p, &AttnProblem::k, &AttnProblem::dk);
}
TEST(ReferenceAttention, GradVByFiniteDifferences) {
  auto p = AttnProblem::random({1, 2, 2, 5, 4}, 3);
  check_gradient(p, &AttnProblem::v, &AttnProblem::dv);
}
TEST(ReferenceAttention, GradBiasByFiniteDifferencesSumsOverSlices) {
  auto p = AttnProblem::random({2, 3, 2, 4, 3}, 4);
  check_gradient(p, &AttnProblem::bias, &AttnProblem::dbias);
}
TEST(ReferenceAttention, GradientsWithExplicitScale) {
  auto p = AttnProblem::random({1, 2, 1, 6, 4}, 5);
  auto f = p.fwd();
  f.scale = 0.3;
  ASSERT_TRUE(reference::attention_forward(f).ok());
  auto b = p.bwd();
  b.scale = 0.3;
  ASSERT_TRUE(reference::attention_backward(b).ok());
  const auto dq = p.dq.values();
  // scale 0.3 on both sides must differ from the default 1/sqrt(4) = 0.5
  run_bwd(p);
  EXPECT_GT(max_abs_diff(dq, p.dq.values()), 1e-3);
}

TEST(ReferenceAttention, ZeroScoresAverageTheAttendedValues) {
  // Q = 0 and bias = 0: every attended key gets the same probability.
  auto p = AttnProblem::random({1, 1, 1, 4, 3}, 6);
  p.q.fill(0.0);
  p.bias.fill(0.0);
  p.mask.set_values({1, 0, 1, 1});
  run_fwd(p);
  const auto v = p.v.values(), o = p.out.values();
  for (int q = 0; q < 4; ++q)
    for (int d = 0; d < 3; ++d)
      EXPECT_NEAR(o[q * 3 + d], (v[0 * 3 + d] + v[2 * 3 + d] + v[3 * 3 + d]) / 3.0, 1e-12);
}

TEST(ReferenceAttention, BiasShiftsProbabilitiesByItsExponential) {
  auto p = AttnProblem::random({1, 1, 1, 2, 1}, 7);
  p.q.fill(0.0);
  p.bias.set_values({std::log(3.0), 0.0, 0.0, 0.0});  // row 0: p = (3/4, 1/4)
  p.has_mask = false;
  run_fwd(p);
  const auto v = p.v.values(), o = p.out.values();
  EXPECT_NEAR(o[0], 0.75 * v[0] + 0.25 * v[1], 1e-12);
  EXPECT_NEAR(o[1], 0.5 * v[0] + 0.5 * v[1], 1e-12);
}

TEST(ReferenceAttention, MaskedKeysDoNotInfluenceTheOutput) {
  auto p = AttnProblem::random({1, 2, 2, 6, 4}, 8);
  run_fwd(p);
  const auto before = p.out.values();
  const auto mask = p.mask.values();
  std::mt19937_64 rng(9);
  std::normal_distribution<double> nd(0, 5);
  // Perturb K and V only at masked keys: True = attend, so masked keys are the zeros.
  for (HostTensor* t : {&p.k, &p.v}) {
    t->for_each([&](int64_t i, int64_t off) {
      const int64_t n = (i / p.sh.D) % p.sh.N, s = (i / (p.sh.D * p.sh.N * p.sh.H)) % p.sh.S;
      if (mask[s * p.sh.N + n] == 0.0) t->set(off, nd(rng));
    });
  }
  run_fwd(p);
  EXPECT_EQ(max_abs_diff(before, p.out.values()), 0.0);
}

TEST(ReferenceAttention, FullyMaskedRowsGiveZerosAndZeroGradients) {
  auto p = AttnProblem::random({1, 2, 2, 5, 4}, 10);
  std::vector<double> m(2 * 5, 1.0);
  for (int n = 0; n < 5; ++n) m[n] = 0.0;  // slice 0: every key masked
  p.mask.set_values(m);
  run_bwd(p);
  const auto o = p.out.values(), dq = p.dq.values(), dk = p.dk.values(), dv = p.dv.values();
  const int64_t slice = 2 * 5 * 4;  // H * N * D elements of slice 0
  for (int64_t i = 0; i < slice; ++i) {
    EXPECT_EQ(o[i], 0.0);
    EXPECT_EQ(dq[i], 0.0);
    EXPECT_EQ(dk[i], 0.0);
    EXPECT_EQ(dv[i], 0.0);
  }
  for (double x : p.out.values()) EXPECT_FALSE(std::isnan(x));
  for (double x : p.lse.values()) EXPECT_FALSE(std::isnan(x));
  EXPECT_TRUE(std::isinf(p.lse.values()[0]));
}

// A NaN in a query makes every score of its row NaN; the row must come out NaN (as PyTorch's
// softmax gives), not read as "every key masked" and come out zero.
TEST(ReferenceAttention, NanQueryGivesNanRowNotZeros) {
  auto p = AttnProblem::random({1, 2, 1, 5, 4}, 12);
  p.has_mask = false;
  auto q = p.q.values();
  q[2 * 4 + 1] = std::nan("");  // slice 0, query 2
  p.q.set_values(q);
  run_bwd(p);
  const auto o = p.out.values(), dq = p.dq.values(), dk = p.dk.values();
  for (int64_t n = 0; n < 5; ++n)
    for (int64_t e = 0; e < 4; ++e) {
      EXPECT_EQ(std::isnan(o[n * 4 + e]), n == 2) << n;   // only that row
      EXPECT_TRUE(std::isnan(dk[n * 4 + e]));              // every key saw the NaN row
      EXPECT_FALSE(std::isnan(o[20 + n * 4 + e]));         // slice 1 untouched
    }
  EXPECT_TRUE(std::isnan(dq[2 * 4]));
  EXPECT_TRUE(std::isnan(p.lse.values()[2]));
}

TEST(ReferenceAttention, SingleKeyCopiesValues) {
  auto p = AttnProblem::random({1, 3, 2, 1, 4}, 11);
  p.has_mask = false;
  run_bwd(p);
  EXPECT_EQ(max_abs_diff(p.out.values(), p.v.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dv.values(), p.dout.values()), 0.0);
  for (double x : p.dq.values()) EXPECT_EQ(x, 0.0);
  for (double x : p.dbias.values()) EXPECT_EQ(x, 0.0);
}

TEST(ReferenceAttention, StridedLayoutsMatchContiguous) {
  auto a = AttnProblem::random({2, 3, 2, 7, 4}, 12);
  run_bwd(a);
  // The same values in OpenFold3's [B,S,N,H,D] layout with padded strides.
  auto b = AttnProblem::random({2, 3, 2, 7, 4}, 12, DType::kFP64, DType::kFP64, 0.8,
                               {0, 1, 3, 2, 4}, 3);
  for (auto m : {&AttnProblem::q, &AttnProblem::k, &AttnProblem::v, &AttnProblem::dout})
    (b.*m).set_values((a.*m).values());
  b.bias.set_values(a.bias.values());
  b.mask.set_values(a.mask.values());
  run_bwd(b);
  for (auto m : {&AttnProblem::out, &AttnProblem::dq, &AttnProblem::dk, &AttnProblem::dv,
                 &AttnProblem::dbias})
    EXPECT_EQ(max_abs_diff((a.*m).values(), (b.*m).values()), 0.0);
}

TEST(ReferenceAttention, ResidualIsTheRoundingErrorOfTheOutput) {
  auto exact = AttnProblem::random({1, 2, 2, 9, 8}, 13);
  run_fwd(exact);
  auto p = AttnProblem::random({1, 2, 2, 9, 8}, 13, DType::kBF16, DType::kFP32);
  for (auto m : {&AttnProblem::q, &AttnProblem::k, &AttnProblem::v})
    (p.*m).set_values((exact.*m).values());  // inputs rounded to bf16
  for (auto m : {&AttnProblem::q, &AttnProblem::k, &AttnProblem::v})
    (exact.*m).set_values((p.*m).values());  // and the exact problem on the same values
  exact.bias.set_values(p.bias.values());
  p.mask.set_values(exact.mask.values());
  run_fwd(exact);
  run_fwd(p);
  const auto o = exact.out.values(), ob = p.out.values(), r = p.res.values();
  double err_plain = 0.0, err_comp = 0.0;
  for (size_t i = 0; i < o.size(); ++i) {
    EXPECT_EQ(ob[i], detail::round_to(DType::kBF16, o[i]));
    err_plain += (ob[i] - o[i]) * (ob[i] - o[i]);
    err_comp += (ob[i] + r[i] - o[i]) * (ob[i] + r[i] - o[i]);
  }
  EXPECT_LT(err_comp, err_plain * 1e-3);  // out + R carries ~16 bits instead of 8
}

TEST(ReferenceAttention, CompensationUsesOutputPlusResidual) {
  auto p = AttnProblem::random({1, 2, 2, 6, 4}, 14, DType::kFP64);
  run_fwd(p);
  // Fake a rounded output and residual: Dlt must use their sum when compensating ...
  auto out = p.out.values(), res = out;
  for (size_t i = 0; i < out.size(); ++i) {
    res[i] = 0.01 * std::sin(static_cast<double>(i));
    out[i] -= res[i];
  }
  p.out.set_values(out);
  p.res.set_values(res);
  auto b = p.bwd();
  ASSERT_TRUE(reference::attention_backward(b).ok());
  const auto dq_comp = p.dq.values();
  // ... which equals running uncompensated on the exact output,
  b.out = HostTensor{}.view;
  ASSERT_TRUE(reference::attention_backward(b).ok());
  EXPECT_LT(max_abs_diff(dq_comp, p.dq.values()), 1e-12);
  // and differs from the uncompensated correction on the shifted output.
  b = p.bwd();
  b.compensate = false;
  ASSERT_TRUE(reference::attention_backward(b).ok());
  EXPECT_GT(max_abs_diff(dq_comp, p.dq.values()), 1e-6);
}

TEST(ReferenceAttention, DefaultScaleIsInverseSqrtHeadDim) {
  auto p = AttnProblem::random({1, 1, 2, 6, 9}, 15);
  run_fwd(p);
  const auto o = p.out.values();
  auto f = p.fwd();
  f.scale = 1.0 / 3.0;
  ASSERT_TRUE(reference::attention_forward(f).ok());
  EXPECT_EQ(max_abs_diff(o, p.out.values()), 0.0);
}

TEST(ReferenceAttention, DifferentSliceAndSequenceCounts) {
  auto p = AttnProblem::random({2, 5, 3, 3, 2}, 16);  // S != N
  check_gradient(p, &AttnProblem::bias, &AttnProblem::dbias);
}

TEST(ReferenceAttention, ResultsDoNotDependOnRepeats) {
  auto p = AttnProblem::random({1, 17, 2, 6, 4}, 17);
  run_bwd(p);
  const auto dbias = p.dbias.values(), dq = p.dq.values();
  run_bwd(p);
  EXPECT_EQ(max_abs_diff(dbias, p.dbias.values()), 0.0);
  EXPECT_EQ(max_abs_diff(dq, p.dq.values()), 0.0);
}

}  // namespace
}  // namespace tpf::test
