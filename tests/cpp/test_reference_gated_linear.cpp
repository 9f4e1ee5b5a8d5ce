// The FP64 reference of the fused gated output projection: the backward's dg and d_o by finite
// differences of the forward, its du and h against their formulas, and the argument checks of
// the CUDA entry points (which need no GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "testing/finite_diff.h"
#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

constexpr int64_t kK = 128, kN = 128, kI = 2, kJ = 3, kR = kI * kJ;

TEST(ReferenceGatedLinear, BackwardMatchesFiniteDifferencesOfTheForward) {
  std::mt19937_64 rng(3);
  auto g = HostTensor::make(DType::kFP64, {kR, kK}), o = HostTensor::make(DType::kFP64, {kR, kK});
  auto w = HostTensor::make(DType::kFP64, {kN, kK}), bias = HostTensor::make(DType::kFP64, {kN});
  auto x = HostTensor::make(DType::kFP64, {1, kI, kJ, kN}), out = HostTensor::make(DType::kFP64, {1, kI, kJ, kN});
  auto scale = HostTensor::make(DType::kFP64, {1, kI, kJ, kN}), dz = HostTensor::make(DType::kFP64, {1, kI, kJ, kN});
  for (HostTensor* t : {&g, &o, &x, &scale, &dz}) t->fill_normal(rng);
  w.fill_normal(rng, 0.1), bias.fill_normal(rng, 0.1);
  const GatedLinearParams p{g.view, o.view, w.view, bias.view, x.view, scale.view, out.view};
  auto du = HostTensor::make(DType::kFP64, {1, kI, kJ, kN});
  auto dg = HostTensor::make(DType::kFP64, {kR, kK}), d_o = HostTensor::make(DType::kFP64, {kR, kK});
  auto h = HostTensor::make(DType::kFP64, {kR, kK});
  ASSERT_TRUE(reference::gated_linear_backward({dz.view, scale.view, g.view, o.view, w.view, du.view, dg.view,
                                                d_o.view, h.view})
                  .ok());
  auto loss = [&] {  // <dz, out>
    EXPECT_TRUE(reference::gated_linear_forward(p).ok());
    return harness::dot(dz, out);
  };
  EXPECT_LT(harness::finite_difference_error(g, dg.values(), loss), 2e-6);
  EXPECT_LT(harness::finite_difference_error(o, d_o.values(), loss), 2e-6);
  for (int64_t i = 0; i < kR * kN; ++i) EXPECT_DOUBLE_EQ(du.at(i), dz.at(i) * scale.at(i));
  for (int64_t i = 0; i < kR * kK; ++i)
    EXPECT_NEAR(h.at(i), o.at(i) / (1 + std::exp(-g.at(i))), 1e-15 * (1 + std::fabs(o.at(i))));
}

TEST(GatedLinearValidation, NamesTheArgumentAtFault) {
  auto g = HostTensor::make(DType::kBF16, {kR, kK}), o = HostTensor::make(DType::kBF16, {kR, kK});
  auto w = HostTensor::make(DType::kBF16, {kN, kK});
  auto x = HostTensor::make(DType::kFP32, {1, kI, kJ, kN}), out = HostTensor::make(DType::kFP32, {1, kI, kJ, kN});
  GatedLinearParams p{g.view, o.view, w.view, {}, x.view, {}, out.view};
  EXPECT_TRUE(validate_gated_linear(p, true).ok());
  auto narrow = HostTensor::make(DType::kBF16, {kR, 64});
  p.o = narrow.view;
  Status s = validate_gated_linear(p, true);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'o'"), std::string::npos) << s.message();
  p.o = o.view;
  auto w64 = HostTensor::make(DType::kFP64, {kN, kK});
  p.w = w64.view;
  EXPECT_FALSE(validate_gated_linear(p, true).ok());  // FP64: the reference's only
  EXPECT_TRUE(validate_gated_linear(p, false).ok());
  p.w = w.view;
  auto bf_out = HostTensor::make(DType::kBF16, {1, kI, kJ, kN});
  p.out = bf_out.view;  // the residual's output is in x's dtype
  s = validate_gated_linear(p, true);
  EXPECT_NE(s.message().find("'out'"), std::string::npos) << s.message();
  p.out = out.view;
  auto scale = HostTensor::make(DType::kBF16, {1, kI, kJ, kN});
  p.scale = scale.view, p.x = {}, p.out = bf_out.view;
  s = validate_gated_linear(p, true);  // a scale without the residual
  EXPECT_NE(s.message().find("'scale'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpf::test
