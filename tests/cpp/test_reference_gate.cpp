// The FP64 reference of the sigmoid gate: its gradient by finite differences on strided rows,
// and the argument checks of the CUDA entry points (which need no GPU).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "testing/finite_diff.h"
#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

// Columns [col, col + W) of the [R, width] host tensor t, as an [R, W] view.
TensorView columns(const HostTensor& t, int64_t col, int64_t W) {
  TensorView v = t.view;
  v.data = static_cast<double*>(v.data) + col;
  v.shape[1] = W;
  return v;
}

TEST(ReferenceSigmoidGate, GradientMatchesFiniteDifferencesOnStridedRows) {
  std::mt19937_64 rng(5);
  auto gw = HostTensor::make(DType::kFP64, {4, 9}), o = HostTensor::make(DType::kFP64, {4, 5});
  auto y = HostTensor::make(DType::kFP64, {4, 5}), y2 = HostTensor::make(DType::kFP64, {4, 5});
  auto dy = HostTensor::make(DType::kFP64, {4, 5}), d_o = HostTensor::make(DType::kFP64, {4, 5});
  auto dgw = HostTensor::make(DType::kFP64, {4, 9});
  gw.fill_normal(rng, 3.0);
  o.fill_normal(rng);
  dy.fill_normal(rng);
  const TensorView g = columns(gw, 2, 5), dg = columns(dgw, 2, 5);  // row stride 9
  ASSERT_TRUE(reference::sigmoid_gate_backward({g, o.view, y2.view, dy.view, dg, d_o.view}).ok());
  auto loss = [&] {
    EXPECT_TRUE(reference::sigmoid_gate_forward({g, o.view, y.view, {}, {}, {}}).ok());
    return harness::dot(y, dy);
  };
  std::vector<double> dgw_full = dgw.values();  // the columns outside g carry no gradient
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j = 0; j < 9; ++j)
      if (j < 2 || j >= 7) dgw_full[r * 9 + j] = 0.0;
  EXPECT_LT(harness::finite_difference_error(gw, dgw_full, loss), 2e-6);
  EXPECT_LT(harness::finite_difference_error(o, d_o.values(), loss), 2e-6);
  loss();
  EXPECT_EQ(y.values(), y2.values());
}

// delta [B, I, J, H] in the ending node's layout (memory order b, j, h, i) over R = B I J rows of
// W = H D: each head's sum of the stored do times o + out_residual.
TEST(ReferenceSigmoidGate, DeltaSumsEachHeadOfDoTimesOutputWithItsResidual) {
  std::mt19937_64 rng(11);
  const int64_t B = 2, I = 3, J = 2, H = 2, D = 4, R = B * I * J, W = H * D;
  auto g = HostTensor::make(DType::kFP64, {R, W}), o = HostTensor::make(DType::kFP64, {R, W});
  auto res = HostTensor::make(DType::kFP64, {R, W}), dy = HostTensor::make(DType::kFP64, {R, W});
  auto dg = HostTensor::make(DType::kFP64, {R, W}), d_o = HostTensor::make(DType::kFP64, {R, W});
  auto delta = HostTensor::make(DType::kFP64, {B, I, J, H}, {0, 2, 3, 1});
  for (HostTensor* t : {&g, &o, &res, &dy}) t->fill_normal(rng);
  delta.fill(std::nan(""));  // poisoned: every element must be written
  SigmoidGateParams p{g.view, o.view, {}, dy.view, dg.view, d_o.view, res.view, delta.view};
  ASSERT_TRUE(reference::sigmoid_gate_backward(p).ok());
  const std::vector<double> dov = d_o.values(), ov = o.values(), rv = res.values(), got = delta.values();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h) {
      double want = 0.0;
      for (int64_t c = h * D; c < (h + 1) * D; ++c) want += dov[r * W + c] * (ov[r * W + c] + rv[r * W + c]);
      EXPECT_NEAR(got[r * H + h], want, 1e-12 * (1.0 + std::abs(want))) << "row " << r << " head " << h;
    }
}

TEST(SigmoidGateValidation, ChecksDeltaAndItsResidual) {
  auto t = [](DType dt, std::vector<int64_t> s) { return HostTensor::make(dt, std::move(s)); };
  auto g = t(DType::kBF16, {12, 64}), o = t(DType::kBF16, {12, 64}), dy = t(DType::kBF16, {12, 64});
  auto dg = t(DType::kBF16, {12, 64}), d_o = t(DType::kBF16, {12, 64}), res = t(DType::kBF16, {12, 64});
  auto delta = t(DType::kFP32, {1, 3, 4, 2});  // D = 32
  auto bwd = [&](TensorView r, TensorView d) {
    return validate_sigmoid_gate({g.view, o.view, {}, dy.view, dg.view, d_o.view, r, d}, true, /*for_gpu=*/true);
  };
  EXPECT_TRUE(bwd(res.view, delta.view).ok()) << bwd(res.view, delta.view).message();
  EXPECT_TRUE(bwd({}, delta.view).ok());
  Status s = bwd(res.view, {});
  EXPECT_NE(s.message().find("'out_residual'"), std::string::npos) << s.message();
  auto rows_off = t(DType::kFP32, {1, 3, 5, 2});  // 15 rows for g's 12
  s = bwd({}, rows_off.view);
  EXPECT_NE(s.message().find("'delta'"), std::string::npos) << s.message();
  auto bf16_delta = t(DType::kBF16, {1, 3, 4, 2});
  EXPECT_NE(bwd({}, bf16_delta.view).message().find("'delta'"), std::string::npos);
  auto one_lane = t(DType::kFP32, {1, 3, 4, 8});  // H = 8, D = 8: one lane a head
  EXPECT_TRUE(bwd({}, one_lane.view).ok());
  auto one_head = t(DType::kFP32, {1, 12, 1, 1});  // H = 1, D = 64: eight lanes
  EXPECT_TRUE(bwd({}, one_head.view).ok());
  auto g48 = t(DType::kBF16, {12, 48}), o48 = t(DType::kBF16, {12, 48}), dy48 = t(DType::kBF16, {12, 48});
  auto dg48 = t(DType::kBF16, {12, 48}), do48 = t(DType::kBF16, {12, 48});
  auto delta2 = t(DType::kFP32, {1, 3, 4, 2});  // D = 24: three lanes a head
  s = validate_sigmoid_gate({g48.view, o48.view, {}, dy48.view, dg48.view, do48.view, {}, delta2.view}, true, true);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.message();
  EXPECT_TRUE(validate_sigmoid_gate({g48.view, o48.view, {}, dy48.view, dg48.view, do48.view, {}, delta2.view}, true,
                                    /*for_gpu=*/false)
                  .ok());
  s = validate_sigmoid_gate({g.view, o.view, g.view, {}, {}, {}, {}, delta.view}, false, true);
  EXPECT_NE(s.message().find("'delta'"), std::string::npos) << s.message();
}

TEST(SigmoidGateValidation, NamesTheArgumentAtFault) {
  auto g = HostTensor::make(DType::kBF16, {4, 12}), o = HostTensor::make(DType::kBF16, {4, 12});
  auto y = HostTensor::make(DType::kBF16, {4, 12});
  Status s = validate_sigmoid_gate({g.view, o.view, y.view, {}, {}, {}}, false, /*for_gpu=*/true);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);  // W = 12
  EXPECT_NE(s.message().find("'g'"), std::string::npos) << s.message();
  auto g8 = HostTensor::make(DType::kFP64, {4, 8}), o7 = HostTensor::make(DType::kFP64, {4, 7});
  auto y8 = HostTensor::make(DType::kFP64, {4, 8});
  s = validate_sigmoid_gate({g8.view, o7.view, y8.view, {}, {}, {}}, false, false);
  EXPECT_NE(s.message().find("'o'"), std::string::npos) << s.message();
  auto o8 = HostTensor::make(DType::kFP64, {4, 8});
  TensorView overlapping = y8.view;
  overlapping.stride[0] = 4;  // rows of 8 four apart
  s = validate_sigmoid_gate({g8.view, o8.view, overlapping, {}, {}, {}}, false, false);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  s = validate_sigmoid_gate({g8.view, o8.view, {}, y8.view, {}, {}}, true, false);
  EXPECT_NE(s.message().find("'dg'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpf::test
