// The FP64 reference of the SwiGLU activation: its gradient by finite differences, and the
// argument checks of the CUDA entry points (which need no GPU).
#include <gtest/gtest.h>

#include <random>

#include "testing/finite_diff.h"
#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

TEST(ReferenceSwiglu, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(21);
  auto x = HostTensor::make(DType::kFP64, {3, 10}), y = HostTensor::make(DType::kFP64, {3, 5});
  auto dy = HostTensor::make(DType::kFP64, {3, 5}), dx = HostTensor::make(DType::kFP64, {3, 10});
  auto y2 = HostTensor::make(DType::kFP64, {3, 5});
  x.fill_normal(rng, 2.0);
  dy.fill_normal(rng);
  ASSERT_TRUE(reference::swiglu_backward({x.view, y2.view, dy.view, dx.view}).ok());
  auto loss = [&] {
    EXPECT_TRUE(reference::swiglu_forward({x.view, y.view, {}, {}}).ok());
    return harness::dot(y, dy);
  };
  EXPECT_LT(harness::finite_difference_error(x, dx.values(), loss), 2e-6);
  loss();
  EXPECT_EQ(y.values(), y2.values());
}

TEST(SwigluValidation, NamesTheArgumentAtFault) {
  auto x = HostTensor::make(DType::kBF16, {4, 12}), y = HostTensor::make(DType::kBF16, {4, 6});
  Status s = validate_swiglu({x.view, y.view, {}, {}}, false, /*for_gpu=*/true);  // H = 6
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  auto odd = HostTensor::make(DType::kFP64, {4, 7});
  s = validate_swiglu({odd.view, y.view, {}, {}}, false, false);
  EXPECT_NE(s.message().find("even"), std::string::npos) << s.message();
  auto x16 = HostTensor::make(DType::kFP64, {4, 16}), y7 = HostTensor::make(DType::kFP64, {4, 7});
  s = validate_swiglu({x16.view, y7.view, {}, {}}, false, false);
  EXPECT_NE(s.message().find("'y'"), std::string::npos) << s.message();
  auto y8 = HostTensor::make(DType::kFP64, {4, 8});
  s = validate_swiglu({x16.view, {}, y8.view, {}}, true, false);
  EXPECT_NE(s.message().find("'dx'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpf::test
