// The FP64 reference of the fused SwiGLU transition: its forward against its backward's h (two
// separately written formulas of the same activation), dxhat by finite differences, and the
// argument checks of the CUDA entry points (which need no GPU).
#include <gtest/gtest.h>

#include <random>

#include "testing/finite_diff.h"
#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

constexpr int64_t kC = 128, kH = 64, kRows = 3;

struct Weights {
  HostTensor w_ab = HostTensor::make(DType::kFP64, {2 * kH, kC}), w_o = HostTensor::make(DType::kFP64, {kC, kH});
  explicit Weights(std::mt19937_64& rng) {
    w_ab.fill_normal(rng, 0.1);
    w_o.fill_normal(rng, 0.1);
  }
};

// y = h W_o^T from the backward's h.
std::vector<double> down(const HostTensor& h, const HostTensor& w_o) {
  std::vector<double> y(kRows * kC, 0.0);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kC; ++c)
      for (int64_t k = 0; k < kH; ++k) y[r * kC + c] += h.at(r * kH + k) * w_o.at(c * kH + k);
  return y;
}

TEST(ReferenceTransition, ForwardIsTheBackwardsActivationProjected) {
  std::mt19937_64 rng(5);
  const Weights w(rng);
  auto x = HostTensor::make(DType::kFP64, {kRows, kC}), out = HostTensor::make(DType::kFP64, {kRows, kC});
  auto xhat = HostTensor::make(DType::kFP64, {kRows, kC});
  x.fill_normal(rng, 2.0);
  TransitionParams p;
  p.x = x.view, p.w_ab = w.w_ab.view, p.w_o = w.w_o.view, p.out = out.view, p.xhat = xhat.view;
  ASSERT_TRUE(reference::transition_forward(p).ok());
  auto g = HostTensor::make(DType::kFP64, {kRows, kC}), h = HostTensor::make(DType::kFP64, {kRows, kH});
  auto dab = HostTensor::make(DType::kFP64, {kRows, 2 * kH}), dx = HostTensor::make(DType::kFP64, {kRows, kC});
  ASSERT_TRUE(reference::transition_backward({xhat.view, g.view, w.w_ab.view, w.w_o.view, h.view, dab.view, dx.view}).ok());
  const std::vector<double> y = down(h, w.w_o);
  for (int64_t i = 0; i < kRows * kC; ++i) EXPECT_NEAR(out.at(i), y[i], 1e-12 * (1 + std::fabs(y[i])));
  for (int64_t r = 0; r < kRows; ++r) {  // xhat: zero mean, unit variance (no weight, no bias)
    double m = 0, v = 0;
    for (int64_t c = 0; c < kC; ++c) m += xhat.at(r * kC + c) / kC;
    for (int64_t c = 0; c < kC; ++c) v += (xhat.at(r * kC + c) - m) * (xhat.at(r * kC + c) - m) / kC;
    EXPECT_NEAR(m, 0.0, 1e-12);
    EXPECT_NEAR(v, 1.0, 1e-4);  // 1 / (1 + eps)
  }
}

TEST(ReferenceTransition, InputGradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(9);
  const Weights w(rng);
  auto xhat = HostTensor::make(DType::kFP64, {kRows, kC}), g = HostTensor::make(DType::kFP64, {kRows, kC});
  auto h = HostTensor::make(DType::kFP64, {kRows, kH}), dab = HostTensor::make(DType::kFP64, {kRows, 2 * kH});
  auto dx = HostTensor::make(DType::kFP64, {kRows, kC});
  xhat.fill_normal(rng);
  g.fill_normal(rng);
  const TransitionBackwardParams p{xhat.view, g.view, w.w_ab.view, w.w_o.view, h.view, dab.view, dx.view};
  ASSERT_TRUE(reference::transition_backward(p).ok());
  const std::vector<double> analytic = dx.values();
  auto loss = [&] {  // <g, h(xhat) W_o^T>
    EXPECT_TRUE(reference::transition_backward(p).ok());
    const std::vector<double> y = down(h, w.w_o);
    double s = 0;
    for (int64_t i = 0; i < kRows * kC; ++i) s += g.at(i) * y[i];
    return s;
  };
  EXPECT_LT(harness::finite_difference_error(xhat, analytic, loss), 2e-6);
}

TEST(TransitionValidation, NamesTheArgumentAtFault) {
  auto x = HostTensor::make(DType::kFP32, {4, kC}), out = HostTensor::make(DType::kFP32, {4, kC});
  auto w_ab = HostTensor::make(DType::kBF16, {2 * kH, kC}), w_o = HostTensor::make(DType::kBF16, {kC, kH});
  TransitionParams p;
  p.x = x.view, p.w_ab = w_ab.view, p.w_o = w_o.view, p.out = out.view, p.residual = true;
  EXPECT_TRUE(validate_transition(p, true).ok());
  auto narrow = HostTensor::make(DType::kFP32, {4, 64});
  p.x = narrow.view;
  Status s = validate_transition(p, true);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  p.x = x.view;
  auto odd_h = HostTensor::make(DType::kBF16, {2 * 48, kC});
  p.w_ab = odd_h.view;
  s = validate_transition(p, true);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'w_ab'"), std::string::npos) << s.message();
  p.w_ab = w_ab.view;
  auto w64 = HostTensor::make(DType::kFP64, {kC, kH});
  p.w_o = w64.view;
  EXPECT_FALSE(validate_transition(p, true).ok());  // FP64 weights: the reference's only
  EXPECT_TRUE(validate_transition(p, false).ok());
  p.w_o = w_o.view;
  auto scale = HostTensor::make(DType::kFP32, {3});
  p.scale = scale.view;
  s = validate_transition(p, true);
  EXPECT_NE(s.message().find("'scale'"), std::string::npos) << s.message();
  p.scale = {};
  auto bf_out = HostTensor::make(DType::kBF16, {4, kC});
  p.out = bf_out.view;  // the residual's output is in x's dtype
  s = validate_transition(p, true);
  EXPECT_NE(s.message().find("'out'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpf::test
