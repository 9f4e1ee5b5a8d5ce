// The FP64 reference of the fused gated output projection against its formula written out (the
// gate read as a column block, the scale broadcast), and the argument checks of the CUDA entry
// point (which need no GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

constexpr int64_t kK = 128, kN = 128, kI = 2, kJ = 3, kR = kI * kJ;

TEST(ReferenceGatedLinear, MatchesTheFormulaThroughStrides) {
  std::mt19937_64 rng(3);
  // g as the gate block of a stacked [R, 520] projection; scale broadcast over i (stride 0)
  auto stacked = HostTensor::make(DType::kFP64, {kR, 520}), o = HostTensor::make(DType::kFP64, {kR, kK});
  auto w = HostTensor::make(DType::kFP64, {kN, kK}), bias = HostTensor::make(DType::kFP64, {kN});
  auto x = HostTensor::make(DType::kFP64, {1, kI, kJ, kN}), out = HostTensor::make(DType::kFP64, {1, kI, kJ, kN});
  auto mask = HostTensor::make(DType::kFP64, {1, 1, kJ, kN});
  for (HostTensor* t : {&stacked, &o, &x, &mask}) t->fill_normal(rng);
  w.fill_normal(rng, 0.1), bias.fill_normal(rng, 0.1);
  const TensorView g = strided_view(static_cast<double*>(stacked.view.data) + 384, DType::kFP64, {kR, kK}, {520, 1});
  const TensorView scale =
      strided_view(mask.view.data, DType::kFP64, {1, kI, kJ, kN}, {kJ * kN, 0, kN, 1});
  ASSERT_TRUE(reference::gated_linear_forward({g, o.view, w.view, bias.view, x.view, scale, out.view}).ok());
  for (int64_t r = 0; r < kR; ++r)
    for (int64_t n = 0; n < kN; ++n) {
      double y = bias.at(n);
      for (int64_t k = 0; k < kK; ++k) {
        const double gate = 1 / (1 + std::exp(-stacked.at(r * 520 + 384 + k)));  // sigmoid(g)
        y += gate * o.at(r * kK + k) * w.at(n * kK + k);
      }
      const double want = x.at(r * kN + n) + mask.at((r % kJ) * kN + n) * y;
      EXPECT_NEAR(out.at(r * kN + n), want, 1e-12 * (1 + std::fabs(want)));
    }
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
