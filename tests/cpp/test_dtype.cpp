// Host dtype conversions used by the reference (round-to-nearest-even) and TensorView basics.
#include <gtest/gtest.h>

#include "testing/host_tensor.h"

namespace tpf::test {
namespace {

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(detail::round_to(DType::kBF16, 1.0), 1.0);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa, 1.
  EXPECT_EQ(detail::round_to(DType::kBF16, 1.0 + std::ldexp(1.0, -8)), 1.0);
  EXPECT_EQ(detail::round_to(DType::kBF16, 1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));
  EXPECT_TRUE(std::isnan(detail::round_to(DType::kBF16, NAN)));
  EXPECT_TRUE(std::isinf(detail::round_to(DType::kBF16, INFINITY)));
}

TEST(Dtype, Fp16RoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(detail::round_to(DType::kFP16, 1.0 + std::ldexp(1.0, -11)), 1.0);
  EXPECT_EQ(detail::round_to(DType::kFP16, 1.0 + 3 * std::ldexp(1.0, -11)), 1.0 + std::ldexp(1.0, -9));
  EXPECT_EQ(detail::round_to(DType::kFP16, 65504.0), 65504.0);
  EXPECT_TRUE(std::isinf(detail::round_to(DType::kFP16, 70000.0)));
  EXPECT_EQ(detail::round_to(DType::kFP16, std::ldexp(1.0, -24)), std::ldexp(1.0, -24));
  EXPECT_EQ(detail::round_to(DType::kFP16, -2.5), -2.5);
}

TEST(Dtype, Bf16RelativeRoundingErrorIsAboutTheFloor) {
  // The accuracy floor of docs/DESIGN.md: relative RMSE of bf16(x) for normal x is ~1.66e-3.
  std::mt19937_64 rng(1);
  std::normal_distribution<double> nd;
  std::vector<double> x(200000), r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = detail::round_to(DType::kBF16, x[i] = nd(rng));
  const double e = rel_rmse(r, x);
  EXPECT_GT(e, 1.4e-3);
  EXPECT_LT(e, 1.9e-3);
}

TEST(TensorView, ContiguityAndOffsets) {
  int dummy;
  auto t = contiguous_view(&dummy, DType::kBF16, {2, 3, 4});
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.offset({1, 2, 3}), 12 + 8 + 3);
  auto u = strided_view(&dummy, DType::kBF16, {2, 3, 4}, {12, 1, 3});
  EXPECT_FALSE(u.is_contiguous());
  EXPECT_EQ(u.numel(), 24);
}

}  // namespace
}  // namespace tpf::test
