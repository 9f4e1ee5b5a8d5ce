// The FP64 reference of the LayerNorm: every gradient by finite differences, the normalised
// output's moments, and the argument checks of the CUDA entry points (which need no GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "testing/finite_diff.h"
#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

struct NormProblem {
  HostTensor x, w, b, y, mean, rstd, dy, dx, dw, db;
  static NormProblem random(int64_t rows, int64_t W, uint64_t seed) {
    std::mt19937_64 rng(seed);
    NormProblem p{HostTensor::make(DType::kFP64, {rows, W}), HostTensor::make(DType::kFP64, {W}),
                  HostTensor::make(DType::kFP64, {W}),       HostTensor::make(DType::kFP64, {rows, W}),
                  HostTensor::make(DType::kFP32, {rows}),    HostTensor::make(DType::kFP32, {rows}),
                  HostTensor::make(DType::kFP64, {rows, W}), HostTensor::make(DType::kFP64, {rows, W}),
                  HostTensor::make(DType::kFP64, {W}),       HostTensor::make(DType::kFP64, {W})};
    for (HostTensor* t : {&p.x, &p.w, &p.b, &p.dy}) t->fill_normal(rng);
    return p;
  }
  LayerNormForwardParams fwd() { return {x.view, w.view, b.view, 1e-5, y.view, mean.view, rstd.view}; }
  LayerNormBackwardParams bwd() { return {fwd(), dy.view, dx.view, dw.view, db.view}; }
};

double loss(NormProblem& p) {
  EXPECT_TRUE(reference::layer_norm_forward(p.fwd()).ok());
  return harness::dot(p.y, p.dy);
}

TEST(ReferenceLayerNorm, GradientsMatchFiniteDifferences) {
  auto p = NormProblem::random(3, 5, 11);
  ASSERT_TRUE(reference::layer_norm_backward(p.bwd()).ok());
  const std::pair<HostTensor*, HostTensor*> cases[] = {{&p.x, &p.dx}, {&p.w, &p.dw}, {&p.b, &p.db}};
  for (auto [in, grad] : cases)
    EXPECT_LT(harness::finite_difference_error(*in, grad->values(), [&] { return loss(p); }), 2e-6);
}

TEST(ReferenceLayerNorm, WithoutAffineRowsHaveZeroMeanAndUnitVariance) {
  auto p = NormProblem::random(4, 64, 12);
  auto f = p.fwd();
  f.weight = f.bias = TensorView{};
  ASSERT_TRUE(reference::layer_norm_forward(f).ok());
  const auto y = p.y.values();
  for (int r = 0; r < 4; ++r) {
    double s = 0, q = 0;
    for (int c = 0; c < 64; ++c) s += y[r * 64 + c], q += y[r * 64 + c] * y[r * 64 + c];
    EXPECT_NEAR(s / 64, 0.0, 1e-12);
    EXPECT_NEAR(q / 64, 1.0, 1e-4);  // var / (var + eps)
  }
}

TEST(LayerNormValidation, NamesTheArgumentAtFault) {
  auto p = NormProblem::random(2, 48, 13);
  auto f = p.fwd();
  f.x.dtype = f.y.dtype = DType::kFP32;
  Status s = validate_layer_norm_forward(f, /*for_gpu=*/true);  // W = 48: not a multiple of 32
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  auto g = NormProblem::random(2, 64, 14).fwd();
  g.y.dtype = DType::kFP64;
  g.x.dtype = DType::kFP32;
  g.weight.dtype = g.bias.dtype = DType::kFP32;
  s = validate_layer_norm_forward(g, true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidType);
  EXPECT_NE(s.message().find("'y'"), std::string::npos) << s.message();
  auto b = p.bwd();
  b.fwd.mean = TensorView{};
  b.fwd.rstd = TensorView{};
  s = validate_layer_norm_backward(b, false);
  EXPECT_NE(s.message().find("'mean'"), std::string::npos) << s.message();
  b = p.bwd();
  b.dweight.shape[0] = 47;
  s = validate_layer_norm_backward(b, false);
  EXPECT_NE(s.message().find("'dweight'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpf::test
