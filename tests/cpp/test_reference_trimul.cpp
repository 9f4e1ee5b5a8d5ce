// The FP64 reference of the triangle multiplicative update: every gradient by finite
// differences in both directions, the incoming/outgoing identity, masks and layouts.
#include <gtest/gtest.h>

#include "testing/finite_diff.h"
#include "testing/trimul_problem.h"

namespace tpf::test {
namespace {

double loss(TrimulProblem& p) {
  EXPECT_TRUE(reference::trimul_forward(p.fwd()).ok());
  return harness::dot(p.out, p.dout);
}

// Gradient `which`: -1 = z, otherwise the index of a weight.
void check_gradient(TrimulProblem& p, int which) {
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  HostTensor& x = which < 0 ? p.z : p.w[which];
  const auto analytic = (which < 0 ? p.dz : p.dw[which]).values();
  EXPECT_LT(harness::finite_difference_error(x, analytic, [&] { return loss(p); }), 2e-6);
}

struct GradCase {
  int which;
  TrimulDirection dir;
};

class ReferenceTrimulGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(ReferenceTrimulGrad, MatchesFiniteDifferences) {
  auto p = TrimulProblem::random(1, 4, 3, 2, 100 + GetParam().which);
  p.direction = GetParam().dir;
  check_gradient(p, GetParam().which);
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  for (auto dir : {TrimulDirection::kOutgoing, TrimulDirection::kIncoming})
    for (int w = -1; w < TrimulProblem::kWeights; ++w) cases.push_back({w, dir});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    AllGradients, ReferenceTrimulGrad, ::testing::ValuesIn(grad_cases()),
    [](const ::testing::TestParamInfo<GradCase>& info) {
      std::string name = info.param.which < 0 ? "z" : TrimulProblem::weight_name(info.param.which);
      return (info.param.dir == TrimulDirection::kOutgoing ? "outgoing_" : "incoming_") + name;
    });

TEST(ReferenceTrimul, IncomingEqualsTransposedOutgoingWithSwappedProjections) {
  auto p = TrimulProblem::random(2, 5, 3, 2, 7);
  p.direction = TrimulDirection::kIncoming;
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  const auto incoming = p.out.values();
  // z -> z^T (and the mask), a <-> b (swap the halves of the input projections), outgoing.
  auto q = TrimulProblem::random(2, 5, 3, 2, 7);
  const int64_t N = 5, C = 3, Ch = 2;
  auto transpose = [&](const std::vector<double>& v, int64_t inner) {
    std::vector<double> t(v.size());
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j)
          for (int64_t c = 0; c < inner; ++c)
            t[((b * N + j) * N + i) * inner + c] = v[((b * N + i) * N + j) * inner + c];
    return t;
  };
  q.z.set_values(transpose(p.z.values(), C));
  q.mask.set_values(transpose(p.mask.values(), 1));
  for (int w : {2, 3, 4, 5}) {  // [a rows; b rows] -> [b rows; a rows]
    auto v = p.w[w].values();
    const int64_t row = w % 2 == 0 ? C : 1;
    std::rotate(v.begin(), v.begin() + Ch * row, v.end());
    q.w[w].set_values(v);
  }
  q.direction = TrimulDirection::kOutgoing;
  ASSERT_TRUE(reference::trimul_forward(q.fwd()).ok());
  EXPECT_LT(max_abs_diff(incoming, transpose(q.out.values(), C)), 1e-12);
}

TEST(ReferenceTrimul, ZeroMaskMakesTheProductZero) {
  // mask = 0: a = b = 0, so x = 0 and LayerNorm_out(x) is its bias whatever its gain.
  auto p = TrimulProblem::random(1, 3, 4, 2, 8);
  p.mask.fill(0.0);
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  const auto out = p.out.values(), gain = p.w[6].values();
  p.w[6].fill(0.0);
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  EXPECT_EQ(max_abs_diff(out, p.out.values()), 0.0);
  p.w[6].set_values(gain);
  p.mask.fill(1.0);  // with the mask open, x != 0 and the output changes
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  EXPECT_GT(max_abs_diff(out, p.out.values()), 1e-3);
}

TEST(ReferenceTrimul, MaskZeroesTheGradientOfMaskedProjections) {
  auto p = TrimulProblem::random(1, 4, 3, 2, 9);
  p.mask.fill(0.0);
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  for (int w : {2, 3, 4, 5})
    for (double x : p.dw[w].values()) EXPECT_EQ(x, 0.0);
}

TEST(ReferenceTrimul, StridedInputsMatchContiguous) {
  auto p = TrimulProblem::random(2, 5, 4, 3, 10);
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  auto q = TrimulProblem::random(2, 5, 4, 3, 10);
  q.z = p.z.copy_as(DType::kFP64, {0, 2, 1, 3}, 2);  // column-major pairs, padded
  q.dout = p.dout.copy_as(DType::kFP64, {}, 1);
  q.dz = HostTensor::make(DType::kFP64, {2, 5, 5, 4}, {2, 1, 0, 3}, 1);
  q.w[2] = p.w[2].copy_as(DType::kFP64, {1, 0});  // transposed weight storage
  ASSERT_TRUE(reference::trimul_backward(q.bwd()).ok());
  ASSERT_TRUE(reference::trimul_forward(q.fwd()).ok());
  EXPECT_EQ(max_abs_diff(p.out.values(), q.out.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dz.values(), q.dz.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dw[2].values(), q.dw[2].values()), 0.0);
}

// dz_in joins dz exactly (fp64), whether separate or dz itself.
TEST(ReferenceTrimul, DzInIsAddedToDz) {
  auto p = TrimulProblem::random(2, 5, 4, 3, 13);
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  const auto plain = p.dz.values();
  std::mt19937_64 rng(14);
  auto q = TrimulProblem::random(2, 5, 4, 3, 13);
  q.dz_in = HostTensor::make(DType::kFP64, {2, 5, 5, 4});
  q.dz_in.fill_normal(rng);
  const auto add = q.dz_in.values();
  ASSERT_TRUE(reference::trimul_backward(q.bwd()).ok());
  auto r = TrimulProblem::random(2, 5, 4, 3, 13);
  r.dz.set_values(add);
  r.dz_in.view = r.dz.view;  // the same storage: added in place
  ASSERT_TRUE(reference::trimul_backward(r.bwd()).ok());
  const auto got = q.dz.values(), in_place = r.dz.values();
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(got[i], plain[i] + add[i]);
    EXPECT_EQ(in_place[i], plain[i] + add[i]);
  }
  EXPECT_EQ(max_abs_diff(p.dw[2].values(), q.dw[2].values()), 0.0);
}

// With a residual: out = residual + scale * update; the backward ignores both (its dout is the
// update's gradient).
TEST(ReferenceTrimul, ResidualUpdateIsResidualPlusScaledUpdate) {
  auto p = TrimulProblem::random(2, 5, 4, 3, 15), q = TrimulProblem::random(2, 5, 4, 3, 15);
  q.add_residual(DType::kFP64, DType::kFP64, 16);
  const auto res = q.residual.values(), s = q.scale.values();
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  ASSERT_TRUE(reference::trimul_forward(q.fwd()).ok());
  const auto u = p.out.values(), got = q.out.values();
  for (size_t i = 0; i < u.size(); ++i) EXPECT_NEAR(got[i], res[i] + s[i] * u[i], 1e-12);
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  ASSERT_TRUE(reference::trimul_backward(q.bwd()).ok());
  EXPECT_EQ(max_abs_diff(p.dz.values(), q.dz.values()), 0.0);
  for (int i : {0, 2, 8, 10}) EXPECT_EQ(max_abs_diff(p.dw[i].values(), q.dw[i].values()), 0.0);
}

TEST(ReferenceTrimul, WithoutBiasesMatchesZeroBiases) {
  auto p = TrimulProblem::random(1, 4, 3, 2, 11);
  for (int w : {3, 5, 9, 11}) p.w[w].fill(0.0);
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  const auto with_zero = p.out.values();
  p.biases = false;
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  EXPECT_EQ(max_abs_diff(with_zero, p.out.values()), 0.0);
}

TEST(ReferenceTrimul, Fp32WeightsGiveFp32GradientsAndBf16Activations) {
  auto p = TrimulProblem::random(1, 3, 4, 2, 12, DType::kBF16, DType::kFP32);
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  EXPECT_EQ(p.dw[2].view.dtype, DType::kFP32);
  // bf16 output is the rounded exact value
  auto e = TrimulProblem::random(1, 3, 4, 2, 12, DType::kFP64, DType::kFP64);
  e.z.set_values(p.z.values());
  for (int i = 0; i < TrimulProblem::kWeights; ++i) e.w[i].set_values(p.w[i].values());
  ASSERT_TRUE(reference::trimul_forward(e.fwd()).ok());
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  const auto exact = e.out.values(), got = p.out.values();
  for (size_t i = 0; i < exact.size(); ++i) EXPECT_EQ(got[i], detail::round_to(DType::kBF16, exact[i]));
}

}  // namespace
}  // namespace tpf::test
