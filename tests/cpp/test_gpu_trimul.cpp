// Triangle multiplicative update CUDA kernels against the FP64 reference. Each test skips
// itself, with the reason, on a machine without a GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "testing/gpu_trimul.h"
#include "testing/tolerances.h"

namespace tpf::test {
namespace {

struct TrimulCase {
  int64_t B, N, C, Ch;
  bool outgoing = true, mask = true, biases = true;
  DType weights = DType::kBF16;
  bool strided = false;  // z and dout as [B, N, N, C] views of a j-major padded buffer
  int repeats = 2;
};

std::string case_name(const TrimulCase& c) {
  std::string n = "B" + std::to_string(c.B) + "_N" + std::to_string(c.N) + "_C" +
                  std::to_string(c.C) + "_Ch" + std::to_string(c.Ch);
  n += c.outgoing ? "_out" : "_in";
  n += c.mask ? "_mask" : "_nomask";
  if (!c.biases) n += "_nobias";
  n += c.weights == DType::kFP32 ? "_wfp32" : "_wbf16";
  if (c.strided) n += "_strided";
  return n;
}

void PrintTo(const TrimulCase& c, std::ostream* os) { *os << case_name(c); }

class GpuTrimul : public ::testing::TestWithParam<TrimulCase> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA GPU on this machine (GPU tests need an sm_90a device)";
  }
};

TEST_P(GpuTrimul, MatchesFp64Reference) {
  const TrimulCase& c = GetParam();
  const uint64_t seed = std::hash<std::string>{}(case_name(c)) ^ 0x51ed270b27d1a3c5ull;
  auto p = TrimulProblem::random(c.B, c.N, c.C, c.Ch, seed, DType::kBF16, c.weights);
  p.has_mask = c.mask;
  p.biases = c.biases;
  p.direction = c.outgoing ? TrimulDirection::kOutgoing : TrimulDirection::kIncoming;
  if (c.strided) {
    p.z = p.z.copy_as(DType::kBF16, {0, 2, 1, 3}, 8);
    p.dout = p.dout.copy_as(DType::kBF16, {0, 2, 1, 3}, 8);
    p.out = p.out.copy_as(DType::kBF16, {0, 2, 1, 3}, 8);
    p.dz = p.dz.copy_as(DType::kBF16, {0, 2, 1, 3}, 8);
  }
  auto ref = harness::trimul_fp64_copy(p);
  ASSERT_TRUE(reference::trimul_forward(ref.fwd()).ok());
  ASSERT_TRUE(reference::trimul_backward(ref.bwd()).ok());

  const auto run = harness::run_trimul_gpu(p, true, c.repeats);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  EXPECT_TRUE(run.deterministic) << "gradients differ between repeated calls";
  const auto err = harness::trimul_errors(p, ref, true);
  std::string line = case_name(c) + " error/floor:";
  for (size_t i = 0; i < err.names.size(); ++i)
    line += " " + err.names[i] + "=" + std::to_string(err.error[i] / err.floor[i]).substr(0, 4);
  std::printf("%s\n", line.c_str());
  for (size_t i = 0; i < err.names.size(); ++i) {
    const double factor = i == 0 ? harness::kTrimulOutFloorFactor : harness::kTrimulGradFloorFactor;
    if (err.floor[i] == 0.0) {
      EXPECT_LT(err.error[i], 1e-4) << err.names[i];
    } else {
      EXPECT_LE(err.error[i], factor * err.floor[i])
          << err.names[i] << ": rel RMSE " << err.error[i] << " floor " << err.floor[i] << " ratio "
          << err.error[i] / err.floor[i];
    }
  }
}

std::vector<TrimulCase> cases() {
  std::vector<TrimulCase> v;
  for (int64_t N : {1, 7, 100})
    for (bool out : {true, false}) v.push_back({1, N, 64, 64, out});
  v.push_back({1, 333, 32, 32, true});
  v.push_back({1, 333, 32, 32, false, true, true, DType::kBF16, true});
  // every supported width, as C and as Ch
  const int64_t widths[][2] = {{32, 256}, {64, 96}, {96, 64}, {128, 128}, {256, 32}};
  for (const auto& w : widths) v.push_back({1, 33, w[0], w[1], true});
  v.push_back({2, 40, 96, 96, false, false, false, DType::kFP32});
  v.push_back({1, 64, 128, 128, true, true, false, DType::kFP32, true});
  v.push_back({2, 17, 32, 64, false, true, true, DType::kBF16, true, 5});  // 5 calls
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuTrimul, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace tpf::test
