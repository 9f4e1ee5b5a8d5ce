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

// The fused projections' reference is the GEMM (w_up's rows un-blocked) followed by the
// activation's reference, forward and backward.
TEST(ReferenceSwiglu, FusedProjectionsAreTheGemmThenTheActivation) {
  std::mt19937_64 rng(22);
  const int64_t M = 5, C = 3, H = 128;
  auto u = HostTensor::make(DType::kFP64, {M, C}), wb = HostTensor::make(DType::kFP64, {2 * H, C});
  auto g = HostTensor::make(DType::kFP64, {M, C}), wd = HostTensor::make(DType::kFP64, {C, H});
  for (auto* t : {&u, &wb, &g, &wd}) t->fill_normal(rng);
  auto x = HostTensor::make(DType::kFP64, {M, 2 * H}), y = HostTensor::make(DType::kFP64, {M, H});
  ASSERT_TRUE(reference::swiglu_forward({x.view, y.view, {}, {}, u.view, wb.view}).ok());
  auto want_x = HostTensor::make(DType::kFP64, {M, 2 * H}), want_y = HostTensor::make(DType::kFP64, {M, H});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < 2 * H; ++n) {  // column n of [a | b]: a's or b's channel j
      const int64_t half = n / H, j = n % H, row = (j / 64) * 128 + half * 64 + j % 64;
      double acc = 0;
      for (int64_t k = 0; k < C; ++k) acc += u.at(m * C + k) * wb.at(row * C + k);
      want_x.set(m * 2 * H + n, acc);
    }
  ASSERT_TRUE(reference::swiglu_forward({want_x.view, want_y.view, {}, {}}).ok());
  EXPECT_EQ(x.values(), want_x.values());
  EXPECT_EQ(y.values(), want_y.values());

  auto dx = HostTensor::make(DType::kFP64, {M, 2 * H}), y2 = HostTensor::make(DType::kFP64, {M, H});
  ASSERT_TRUE(reference::swiglu_backward({x.view, y2.view, {}, dx.view, {}, {}, g.view, wd.view}).ok());
  auto dy = HostTensor::make(DType::kFP64, {M, H}), want_dx = HostTensor::make(DType::kFP64, {M, 2 * H});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < H; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < C; ++k) acc += g.at(m * C + k) * wd.at(k * H + j);
      dy.set(m * H + j, acc);
    }
  ASSERT_TRUE(reference::swiglu_backward({x.view, {}, dy.view, want_dx.view}).ok());
  EXPECT_EQ(dx.values(), want_dx.values());
  EXPECT_EQ(y2.values(), y.values());
}

TEST(SwigluValidation, FusedProjectionsNameTheArgumentAtFault) {
  auto x = HostTensor::make(DType::kBF16, {4, 256}), y = HostTensor::make(DType::kBF16, {4, 128});
  auto u = HostTensor::make(DType::kBF16, {4, 16}), w = HostTensor::make(DType::kBF16, {256, 16});
  EXPECT_TRUE(validate_swiglu({x.view, y.view, {}, {}, u.view, w.view}, false, true).ok());
  auto w_bad = HostTensor::make(DType::kBF16, {128, 16});
  Status s = validate_swiglu({x.view, y.view, {}, {}, u.view, w_bad.view}, false, true);
  EXPECT_NE(s.message().find("'w_up'"), std::string::npos) << s.message();
  s = validate_swiglu({x.view, y.view, {}, {}, {}, w.view}, false, true);
  EXPECT_NE(s.message().find("'u'"), std::string::npos) << s.message();
  auto u_odd = HostTensor::make(DType::kBF16, {4, 12}), w_odd = HostTensor::make(DType::kBF16, {256, 12});
  s = validate_swiglu({x.view, y.view, {}, {}, u_odd.view, w_odd.view}, false, true);  // C = 12
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'u'"), std::string::npos) << s.message();
  auto x96 = HostTensor::make(DType::kFP64, {4, 192}), y96 = HostTensor::make(DType::kFP64, {4, 96});
  auto u64 = HostTensor::make(DType::kFP64, {4, 16}), w96 = HostTensor::make(DType::kFP64, {192, 16});
  s = validate_swiglu({x96.view, y96.view, {}, {}, u64.view, w96.view}, false, false);  // H = 96
  EXPECT_NE(s.message().find("multiple of 64"), std::string::npos) << s.message();
  auto x32 = HostTensor::make(DType::kFP32, {4, 256}), y32 = HostTensor::make(DType::kFP32, {4, 128});
  auto u32 = HostTensor::make(DType::kFP32, {4, 16}), w32 = HostTensor::make(DType::kFP32, {256, 16});
  s = validate_swiglu({x32.view, y32.view, {}, {}, u32.view, w32.view}, false, true);  // fp32: no wgmma
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  auto dx = HostTensor::make(DType::kBF16, {4, 256}), g = HostTensor::make(DType::kBF16, {4, 16});
  auto wd = HostTensor::make(DType::kBF16, {16, 128}), dy = HostTensor::make(DType::kBF16, {4, 128});
  EXPECT_TRUE(validate_swiglu({x.view, y.view, {}, dx.view, {}, {}, g.view, wd.view}, true, true).ok());
  s = validate_swiglu({x.view, y.view, dy.view, dx.view, {}, {}, g.view, wd.view}, true, true);
  EXPECT_NE(s.message().find("'dy'"), std::string::npos) << s.message();
  s = validate_swiglu({x.view, y.view, {}, dx.view, {}, {}, g.view, w.view}, true, true);  // [2H, C], not [C, H]
  EXPECT_NE(s.message().find("'w_down'"), std::string::npos) << s.message();
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
