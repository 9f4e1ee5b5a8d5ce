// The FP64 reference of the residual update on a broadcast scale, and the argument checks of the
// CUDA entry points (which need no GPU).
#include <gtest/gtest.h>

#include <random>

#include "testing/host_tensor.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {
namespace {

TEST(ReferenceResidual, BroadcastScaleAndBranchGradient) {
  std::mt19937_64 rng(3);
  auto z = HostTensor::make(DType::kFP64, {1, 3, 4, 2}), u = HostTensor::make(DType::kFP64, {1, 3, 4, 2});
  auto s = HostTensor::make(DType::kFP64, {1, 1, 4, 2}), out = HostTensor::make(DType::kFP64, {1, 3, 4, 2});
  auto du = HostTensor::make(DType::kFP64, {1, 3, 4, 2});
  z.fill_normal(rng);
  u.fill_normal(rng);
  s.fill_normal(rng);
  TensorView sv = s.view;  // [1, 1, 4, 2] broadcast over i
  sv.shape[1] = 3, sv.stride[1] = 0;
  ASSERT_TRUE(reference::residual_forward({z.view, u.view, sv, out.view, {}, {}}).ok());
  ASSERT_TRUE(reference::residual_backward({{}, {}, sv, {}, z.view, du.view}).ok());
  const auto zs = z.values(), us = u.values(), ss = s.values(), os = out.values(), ds = du.values();
  for (int i = 0; i < 3; ++i)
    for (int jc = 0; jc < 8; ++jc) {
      EXPECT_DOUBLE_EQ(os[i * 8 + jc], zs[i * 8 + jc] + ss[jc] * us[i * 8 + jc]);
      EXPECT_DOUBLE_EQ(ds[i * 8 + jc], zs[i * 8 + jc] * ss[jc]);
    }
}

TEST(ResidualValidation, NamesTheArgumentAtFault) {
  auto z = HostTensor::make(DType::kFP32, {1, 2, 2, 12}), u = HostTensor::make(DType::kBF16, {1, 2, 2, 12});
  auto out = HostTensor::make(DType::kFP32, {1, 2, 2, 12});
  Status st = validate_residual({z.view, u.view, {}, out.view, {}, {}}, false, /*for_gpu=*/true);  // C = 12
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("'z'"), std::string::npos) << st.message();
  auto z8 = HostTensor::make(DType::kBF16, {1, 2, 2, 8}), u8 = HostTensor::make(DType::kFP32, {1, 2, 2, 8});
  auto o8 = HostTensor::make(DType::kBF16, {1, 2, 2, 8});
  st = validate_residual({z8.view, u8.view, {}, o8.view, {}, {}}, false, true);  // bf16 z, fp32 u
  EXPECT_NE(st.message().find("'u'"), std::string::npos) << st.message();
  auto s = HostTensor::make(DType::kBF16, {1, 2, 2, 16});
  TensorView strided = s.view;
  strided.shape[3] = 8, strided.stride[3] = 2;
  auto zf = HostTensor::make(DType::kFP32, {1, 2, 2, 8}), ub = HostTensor::make(DType::kBF16, {1, 2, 2, 8});
  auto of = HostTensor::make(DType::kFP32, {1, 2, 2, 8});
  st = validate_residual({zf.view, ub.view, strided, of.view, {}, {}}, false, true);
  EXPECT_NE(st.message().find("'scale'"), std::string::npos) << st.message();
  st = validate_residual({{}, {}, {}, {}, zf.view, {}}, true, false);
  EXPECT_NE(st.message().find("'du'"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tpf::test
