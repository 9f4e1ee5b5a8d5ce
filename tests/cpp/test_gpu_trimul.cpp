// Triangle multiplicative update CUDA kernels against the FP64 reference. Each test skips
// itself, with the reason, on a machine without a GPU.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>

#include "testing/device_trimul.h"
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
  bool saved = true;  // the training path (forward keeps its saved set); false: backward recomputes
  // dz in fp32 with a residual's gradient added in the call (dz_in): 1 separate, 2 in place
  int residual = 0;
  // the residual update around the op (fp32 residual and out, a dropout-like bf16 scale), with
  // dz_in: what the Pairformer's residual_update passes
  bool update = false;
};

std::string case_name(const TrimulCase& c) {
  std::string n = "B" + std::to_string(c.B) + "_N" + std::to_string(c.N) + "_C" +
                  std::to_string(c.C) + "_Ch" + std::to_string(c.Ch);
  n += c.outgoing ? "_out" : "_in";
  n += c.mask ? "_mask" : "_nomask";
  if (!c.biases) n += "_nobias";
  n += c.weights == DType::kFP32 ? "_wfp32" : "_wbf16";
  if (c.strided) n += "_strided";
  if (!c.saved) n += "_recompute";
  if (c.residual) n += c.residual == 2 ? "_dzin_inplace" : "_dzin";
  if (c.update) n += "_residual_update";
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
  if (c.update) p.add_residual(DType::kFP32, DType::kBF16, seed + 2);
  auto ref = harness::trimul_fp64_copy(p);
  ASSERT_TRUE(reference::trimul_forward(ref.fwd()).ok());
  ASSERT_TRUE(reference::trimul_backward(ref.bwd()).ok());
  if (c.residual) {  // fp32 dz = gradient + an addend of the gradient's size, fresh random
    double ms = 0;
    for (double v : ref.dz.values()) ms += v * v;
    std::mt19937_64 rng(seed + 1);
    p.dz = HostTensor::make(DType::kFP32, {c.B, c.N, c.N, c.C});
    p.dz_in = HostTensor::make(DType::kFP32, {c.B, c.N, c.N, c.C});
    p.dz_in.fill_normal(rng, std::sqrt(ms / ref.dz.values().size()) + 1e-30);
    p.dz_in_alias = c.residual == 2;
  }

  const auto run = harness::run_trimul_gpu(p, true, c.repeats, c.saved);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  if (c.residual) {  // the update's own gradient, to compare with the reference's: only the
                     // fp32 rounding of the sum is left in it (far below the bf16 floor)
    std::vector<double> g = p.dz.values();
    const std::vector<double> add = p.dz_in.values();
    for (size_t i = 0; i < g.size(); ++i) g[i] -= add[i];
    p.dz.set_values(g);
  }
  if (c.update) {  // the update alone (scale * update) on both sides: the residual is exact
    for (TrimulProblem* q : {&p, &ref}) {
      std::vector<double> o = q->out.values();
      const std::vector<double> res = q->residual.values();
      for (size_t i = 0; i < o.size(); ++i) o[i] -= res[i];
      q->out.set_values(o);
    }
  }
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
  // N % 8 == 0 with C = 32: the input projection's fragment epilogue over one partial k-step
  v.push_back({1, 48, 32, 64, false});
  // N % 8 == 0 (the projection on the TMA loop) at the widest C (two output-gate tiles) and Ch
  v.push_back({1, 40, 256, 32, true});
  v.push_back({1, 24, 64, 256, false});
  v.push_back({1, 64, 128, 128, true, true, false, DType::kFP32, true});
  v.push_back({2, 17, 32, 64, false, true, true, DType::kBF16, true, 5});  // 5 calls
  // the backward that recomputes the forward (no saved set)
  for (bool out : {true, false}) v.push_back({1, 7, 64, 64, out, true, true, DType::kBF16, false, 2, false});
  v.push_back({1, 333, 32, 32, false, true, true, DType::kBF16, true, 2, false});
  v.push_back({2, 40, 96, 96, false, false, false, DType::kFP32, false, 2, false});
  v.push_back({1, 33, 256, 32, true, true, true, DType::kBF16, false, 2, false});
  // C = Ch = 128 recomputing: the low-memory tail over 5 pixel chunks, the last one short
  v.push_back({1, 100, 128, 128, false, true, true, DType::kBF16, false, 2, false});
  // the recomputing backward's overlays (workspace.h's plan_recompute; test_trimul_workspace.cpp
  // checks that these shapes take them): every buffer in four regions as lives end, the gate
  // logit's gradient over the logit, x̂_in made again for each tail chunk; the fused tail at
  // Ch < C over 7 chunks, the three-kernel tail over 6 with two batches (and B1_N104_C128_Ch128
  // recomputing below: the fused tail over 6)
  v.push_back({1, 80, 128, 64, true, true, true, DType::kBF16, false, 2, false});
  v.push_back({2, 72, 96, 96, false, true, false, DType::kFP32, false, 2, false});
  // fp32 dz plus dz_in (a residual's gradient): the fused LayerNorm backward (C = 128, odd N),
  // in place, strided, and the row kernel's path (C = 256)
  v.push_back({1, 100, 128, 128, true, true, false, DType::kFP32, false, 2, true, 1});
  v.push_back({1, 7, 128, 128, false, true, false, DType::kFP32, false, 2, true, 2});
  v.push_back({1, 33, 64, 64, false, true, true, DType::kBF16, true, 2, true, 1});
  v.push_back({1, 33, 256, 32, true, true, true, DType::kBF16, false, 2, true, 2});
  // the residual update in the output stage: the Pairformer's configuration (C = Ch = 128, no
  // biases, fp32 weights, odd N), and recomputing in place at C = 64
  v.push_back({1, 100, 128, 128, true, true, false, DType::kFP32, false, 2, true, 1, true});
  v.push_back({1, 33, 64, 64, false, true, true, DType::kBF16, false, 2, false, 2, true});
  // the fused backward tail (C = 128, N % 8 == 0): every count of a/b column tiles (Ch = 32 ..
  // 128), partial last row tiles, strided z, no mask or biases, two batches, and the low-memory
  // chunks recomputing with dz_in in place
  v.push_back({1, 96, 128, 128, false});
  v.push_back({1, 40, 128, 64, true, true, true, DType::kBF16, true});
  v.push_back({1, 24, 128, 32, false, false, false, DType::kFP32});
  v.push_back({2, 48, 128, 96, true});
  v.push_back({1, 104, 128, 128, false, true, true, DType::kBF16, false, 2, false, 2});
  v.push_back({1, 104, 128, 128, true, true, false, DType::kFP32, false, 2, true, 1, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuTrimul, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace tpf::test

namespace tpf::test {
namespace {

// FP64 output of the outgoing update at pixel (i, j) from host copies of z rows i and j:
// x[i,j] needs a over row i and b over row j only.
std::vector<double> sampled_outgoing_out(const std::vector<float>& zi, const std::vector<float>& zj,
                                         const std::vector<float>& zij, const std::vector<float>& mi,
                                         const std::vector<float>& mj,
                                         const std::vector<std::vector<float>>& w, int64_t N,
                                         int64_t C, int64_t Ch) {
  auto ln = [](const float* v, int64_t n, const std::vector<float>& g, const std::vector<float>& b) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < n; ++c) mu += v[c];
    mu /= n;
    for (int64_t c = 0; c < n; ++c) var += (v[c] - mu) * (v[c] - mu);
    const double rs = 1.0 / std::sqrt(var / n + 1e-5);
    std::vector<double> o(n);
    for (int64_t c = 0; c < n; ++c) o[c] = (v[c] - mu) * rs * g[c] + b[c];
    return o;
  };
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  auto proj = [&](const std::vector<double>& zn, int64_t row, const std::vector<float>& W,
                  const std::vector<float>& bias) {
    double s = bias[row];
    for (int64_t c = 0; c < C; ++c) s += zn[c] * W[row * C + c];
    return s;
  };
  std::vector<double> x(Ch, 0.0);
  for (int64_t k = 0; k < N; ++k) {
    const auto zni = ln(&zi[k * C], C, w[0], w[1]), znj = ln(&zj[k * C], C, w[0], w[1]);
    for (int64_t c = 0; c < Ch; ++c) {
      const double a = sig(proj(zni, c, w[4], w[5])) * proj(zni, c, w[2], w[3]) * mi[k];
      const double b = sig(proj(znj, Ch + c, w[4], w[5])) * proj(znj, Ch + c, w[2], w[3]) * mj[k];
      x[c] += a * b;
    }
  }
  std::vector<float> xf(x.begin(), x.end());
  std::vector<double> xn(Ch);
  {
    double mu = 0, var = 0;
    for (double v : x) mu += v;
    mu /= Ch;
    for (double v : x) var += (v - mu) * (v - mu);
    const double rs = 1.0 / std::sqrt(var / Ch + 1e-5);
    for (int64_t c = 0; c < Ch; ++c) xn[c] = (x[c] - mu) * rs * w[6][c] + w[7][c];
  }
  const auto zn = ln(zij.data(), C, w[0], w[1]);
  std::vector<double> out(C);
  for (int64_t o = 0; o < C; ++o) {
    double y = w[9][o], g = w[11][o];
    for (int64_t c = 0; c < Ch; ++c) y += xn[c] * w[8][o * Ch + c];
    for (int64_t c = 0; c < C; ++c) g += zn[c] * w[10][o * C + c];
    out[o] = sig(g) * y;
  }
  return out;
}

std::vector<float> fetch_bf16(const void* dev, int64_t offset, int64_t count) {
  std::vector<__nv_bfloat16> h(count);
  harness::cuda_ok(cudaMemcpy(h.data(), static_cast<const __nv_bfloat16*>(dev) + offset, count * 2,
                              cudaMemcpyDeviceToHost), "D2H");
  std::vector<float> f(count);
  for (int64_t i = 0; i < count; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// Which backward paths large_forward_backward runs: from the saved set, then the one that
// recomputes the forward as well; or the saved path where the device holds its saved set and
// workspace, the recompute path alone where it does not.
enum class LargePaths { kSavedAndRecompute, kSavedIfItFits };

// Large N at C = 128 runs forward and backward without index overflow (N = 3072: issue 5; N =
// 4096: the multiplicative-update issue's bound). The forward is checked against an FP64
// reference at sampled pixels; each backward for finite, bitwise repeatable gradients, and the
// recompute path after the saved one for agreeing with it.
void large_forward_backward(int64_t N, LargePaths paths) {
  constexpr int64_t C = 128;
  harness::DeviceTrimul p(1, N, C, C, true, 2024);
  // Weights of a trained scale: N(0, 1/C) projections, LayerNorm gains near 1.
  std::vector<std::vector<float>> w(12);
  const TrimulWeights& fw = p.fwd.w;
  const TensorView* views[12] = {&fw.norm_in_weight, &fw.norm_in_bias, &fw.p_in_weight, &fw.p_in_bias,
                                 &fw.g_in_weight, &fw.g_in_bias, &fw.norm_out_weight, &fw.norm_out_bias,
                                 &fw.p_out_weight, &fw.p_out_bias, &fw.g_out_weight, &fw.g_out_bias};
  for (int i = 0; i < 12; ++i) {
    const TensorView& t = *views[i];
    std::vector<float> v = fetch_bf16(t.data, 0, t.numel());
    const bool gain = i == 0 || i == 6, matrix = t.rank == 2;
    for (auto& x : v) x = gain ? 1.f + 0.1f * x : matrix ? x / std::sqrt(float(t.shape[1])) : 0.1f * x;
    std::vector<__nv_bfloat16> hb(v.size());
    for (size_t k = 0; k < v.size(); ++k) hb[k] = __float2bfloat16_rn(v[k]), v[k] = __bfloat162float(hb[k]);
    harness::cuda_ok(cudaMemcpy(t.data, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "H2D");
    w[i] = v;
  }
  size_t free_bytes = 0, total_bytes = 0;
  harness::cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const bool fits = p.saved_bytes + std::max(p.fwd_saving_bytes, p.bwd_saved_bytes) < free_bytes;
  const bool recompute = paths == LargePaths::kSavedAndRecompute || !fits;
  const bool saved = paths == LargePaths::kSavedAndRecompute || fits;
  std::printf("N=%lld backward paths:%s%s\n", static_cast<long long>(N), saved ? " saved" : "",
              recompute ? " recompute" : "");
  if (saved) p.forward_saving();  // the training path; its out equals the inference forward's
  else p.forward();
  harness::cuda_ok(cudaDeviceSynchronize(), "forward");
  p.fwd_ws = harness::DeviceBuffer();  // dead now; at N = 4096 the backward's needs its room
  const int64_t samples[][2] = {{0, 0}, {1, N - 1}, {N / 2, 17}, {N - 1, N - 1}, {2 * N / 3, N / 3}, {N - 72, 5}};
  std::vector<double> got, want;
  for (const auto& s : samples) {
    const int64_t i = s[0], j = s[1];
    const auto zi = fetch_bf16(p.z.get(), i * N * C, N * C), zj = fetch_bf16(p.z.get(), j * N * C, N * C);
    const auto zij = fetch_bf16(p.z.get(), (i * N + j) * C, C);
    std::vector<uint8_t> mi(N), mj(N);
    harness::cuda_ok(cudaMemcpy(mi.data(), static_cast<uint8_t*>(p.mask.get()) + i * N, N, cudaMemcpyDeviceToHost), "D2H");
    harness::cuda_ok(cudaMemcpy(mj.data(), static_cast<uint8_t*>(p.mask.get()) + j * N, N, cudaMemcpyDeviceToHost), "D2H");
    const auto ref = sampled_outgoing_out(zi, zj, zij, std::vector<float>(mi.begin(), mi.end()),
                                          std::vector<float>(mj.begin(), mj.end()), w, N, C, C);
    const auto out = fetch_bf16(p.out.get(), (i * N + j) * C, C);
    got.insert(got.end(), out.begin(), out.end());
    want.insert(want.end(), ref.begin(), ref.end());
  }
  std::vector<double> rounded(want.size());
  for (size_t k = 0; k < want.size(); ++k) rounded[k] = detail::round_to(DType::kBF16, want[k]);
  const double err = rel_rmse(got, want), floor = rel_rmse(rounded, want);
  std::printf("N=%lld sampled out error/floor: %.2f\n", static_cast<long long>(N), err / floor);
  EXPECT_LE(err, harness::kTrimulOutFloorFactor * floor) << "rel RMSE " << err << " floor " << floor;

  std::vector<std::vector<float>> first;
  for (int rep = 0; rep < (saved && recompute ? 3 : 2); ++rep) {
    if (!saved) p.backward_recompute();  // twice: repeatable
    else if (rep < 2) p.backward();      // from the saved set, twice: repeatable
    else p.backward_recompute();
    harness::cuda_ok(cudaDeviceSynchronize(), "backward");
    std::vector<std::vector<float>> now = {fetch_bf16(p.dz.get(), 0, N * N * C)};
    for (auto& g : p.dw) now.push_back(fetch_bf16(g.get(), 0, g.bytes() / 2));
    if (rep == 0) {
      for (const auto& v : now)
        for (float x : v) ASSERT_TRUE(std::isfinite(x)) << "non-finite gradient";
      first = std::move(now);
    } else if (rep == 1) {
      EXPECT_TRUE(now == first) << "gradients differ between two backward calls";
    } else {  // the recompute path: finite, and close to the saved path's (its operands are bf16)
      double num = 0, den = 0;
      for (size_t t = 0; t < now.size(); ++t)
        for (size_t k = 0; k < now[t].size(); ++k) {
          ASSERT_TRUE(std::isfinite(now[t][k])) << "non-finite gradient (recompute)";
          if (t == 0) num += double(now[0][k] - first[0][k]) * (now[0][k] - first[0][k]), den += double(first[0][k]) * first[0][k];
        }
      EXPECT_LT(std::sqrt(num / den), 0.05) << "dz of the recompute path is far from the saved path's";
    }
  }
}

TEST(GpuTrimulLarge, N3072ForwardAndBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (GPU tests need an sm_90a device)";
  large_forward_backward(3072, LargePaths::kSavedAndRecompute);
}

TEST(GpuTrimulLarge, N4096ForwardAndBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (GPU tests need an sm_90a device)";
  // The training pair's saved set and backward workspace (~93 GiB at N = 4096) fit an H200, not an
  // 80 GB H100; there the recompute path (~33 GiB of workspace) runs.
  large_forward_backward(4096, LargePaths::kSavedIfItFits);
}

}  // namespace
}  // namespace tpf::test
