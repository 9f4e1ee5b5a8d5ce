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
