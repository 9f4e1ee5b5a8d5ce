// tpf bench: CUDA-event timings of the attention kernels (median of many calls after warm-up),
// TFLOP/s and the fraction of the exponential-unit floor. Needs a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cli/cli.h"
#include "testing/device_buffer.h"
#include "testing/device_attention.h"
#include "testing/device_trimul.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::cli {
namespace {

using harness::cuda_ok;
using harness::DeviceBuffer;

// H200 ceiling of ex2.approx measured for docs/DESIGN.md: 4.16e12 exponentials per second.
constexpr double kExpPerSecond = 4.16e12;

struct Result {
  int N, D, H, S;
  double fwd_ms, fwdbwd_ms, fwd_tflops, fwdbwd_tflops, fwd_floor_frac, fwdbwd_floor_frac;
  double workspace_mib, peak_mib;
};

}  // namespace

double median_ms(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "event");
  cuda_ok(cudaEventCreate(&b), "event");
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(a), "record");
    fn();
    cuda_ok(cudaEventRecord(b), "record");
    cuda_ok(cudaEventSynchronize(b), "sync");
    float ms;
    cuda_ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

namespace {

Result bench_attention(int N, int D, int H, int S, bool compensate, bool dbias_on, int iters,
                       DType dtype, DType bias_dtype) {
  harness::DeviceAttention p(S, H, N, D, /*seed=*/1, 0.8, compensate, dbias_on, dtype, bias_dtype);
  const int64_t x = int64_t{S} * H * N * D;
  const size_t ws_bytes = p.workspace_bytes;
  const double fwd = median_ms([&] { p.forward(); }, 3, iters);
  const double both = median_ms(
      [&] {
        p.forward();
        p.backward();
      },
      3, iters);
  cuda_ok(cudaDeviceSynchronize(), "sync");
  const double sc = double(S) * H * N * double(N);
  const double exp_floor_ms = sc / kExpPerSecond * 1e3;
  size_t free_b, total_b;
  cudaMemGetInfo(&free_b, &total_b);
  Result r{N, D, H, S, fwd, both,
           4 * sc * D / (fwd * 1e-3) / 1e12, 14 * sc * D / (both * 1e-3) / 1e12,
           exp_floor_ms / fwd, 2 * exp_floor_ms / both,
           ws_bytes / 1048576.0, (10.0 * x * 2 + ws_bytes) / 1048576.0};
  return r;
}

struct TrimulResult {
  int N, C, Ch;
  bool outgoing;
  double fwd_ms, fwdbwd_ms, fwd_tflops, fwdbwd_tflops, fwd_ws_mib, bwd_ws_mib;
  double saving_fwd_ms, recompute_ms, saved_mib;
};

// Forward FLOPs: input projections (4Ch + C outputs), triangle product, output projection.
// Forward+backward counts 3x the forward (the backward does two products per forward one).
TrimulResult bench_trimul(int N, int C, int Ch, bool outgoing, int iters) {
  harness::DeviceTrimul p(1, N, C, Ch, outgoing, /*seed=*/1);
  const double pairs = double(N) * N;
  const double flops = 2 * pairs * C * (4.0 * Ch + C) + 2 * pairs * N * Ch + 2 * pairs * Ch * C;
  const double fwd = median_ms([&] { p.forward(); }, 3, iters);
  // Training: the forward saves what the backward needs; the backward reads it.
  const double both = median_ms([&] { p.forward_saving(); p.backward(); }, 3, iters);
  const double saving = median_ms([&] { p.forward_saving(); }, 3, iters);
  const double recompute = median_ms([&] { p.forward(); p.backward_recompute(); }, 3, iters);
  cuda_ok(cudaDeviceSynchronize(), "sync");
  return {N, C, Ch, outgoing, fwd, both, flops / (fwd * 1e-3) / 1e12,
          3 * flops / (both * 1e-3) / 1e12, p.fwd_saving_bytes / 1048576.0, p.bwd_saved_bytes / 1048576.0,
          saving, recompute, p.saved_bytes / 1048576.0};
}

int bench_trimul_cmd(const Args& args) {
  const auto Ns = int_list(option(args, "--n", "384,768,1024"));
  const int C = std::stoi(option(args, "--c", "128"));
  const int Ch = std::stoi(option(args, "--ch", option(args, "--c", "128")));
  const int iters = std::stoi(option(args, "--iters", "20"));
  const bool outgoing = option(args, "--direction", "outgoing") != "incoming";
  std::vector<TrimulResult> rs;
  for (int N : Ns) {
    rs.push_back(bench_trimul(N, C, Ch, outgoing, iters));
    if (!has_flag(args, "--json")) std::fprintf(stderr, "  done N=%d\n", N);
  }
  if (has_flag(args, "--json")) {
    std::printf("{\"gpu\": \"%s\", \"op\": \"triangle_multiplicative_update\", \"B\": 1, "
                "\"C\": %d, \"Ch\": %d, \"direction\": \"%s\", \"iters\": %d, \"results\": [\n",
                json_escape(gpu_name()).c_str(), C, Ch, outgoing ? "outgoing" : "incoming", iters);
    for (size_t i = 0; i < rs.size(); ++i) {
      const auto& r = rs[i];
      std::printf("  {\"N\": %d, \"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"fwd_tflops\": %.1f, "
                  "\"fwd_bwd_tflops\": %.1f, \"fwd_workspace_mib\": %.1f, \"bwd_workspace_mib\": %.1f, "
                  "\"saved_mib\": %.1f, \"saving_fwd_ms\": %.4f, \"fwd_bwd_recompute_ms\": %.4f}%s\n",
                  r.N, r.fwd_ms, r.fwdbwd_ms, r.fwd_tflops, r.fwdbwd_tflops, r.fwd_ws_mib,
                  r.bwd_ws_mib, r.saved_mib, r.saving_fwd_ms, r.recompute_ms, i + 1 < rs.size() ? "," : "");
    }
    std::puts("]}");
  } else {
    std::printf("triangle multiplicative update on %s, B=1 C=%d Ch=%d %s, bf16, 10%% pairs masked\n",
                gpu_name().c_str(), C, Ch, outgoing ? "outgoing" : "incoming");
    std::printf("fwd: inference; fwd+bwd: training (saving forward + backward from the saved set);\n"
                "saving fwd: the training forward alone; recompute: forward + a backward that recomputes\n");
    std::printf("%6s %10s %9s %12s %9s %11s %13s %10s %10s %10s\n", "N", "fwd ms", "TFLOP/s", "fwd+bwd ms",
                "TFLOP/s", "saving fwd", "recompute ms", "saved MiB", "fwd ws MiB", "bwd ws MiB");
    for (const auto& r : rs)
      std::printf("%6d %10.3f %9.1f %12.3f %9.1f %11.3f %13.3f %10.1f %10.1f %10.1f\n", r.N, r.fwd_ms,
                  r.fwd_tflops, r.fwdbwd_ms, r.fwdbwd_tflops, r.saving_fwd_ms, r.recompute_ms,
                  r.saved_mib, r.fwd_ws_mib, r.bwd_ws_mib);
  }
  return 0;
}

}  // namespace

int cmd_bench(const Args& args) {
  if (print_help(args,
                 "usage: tpf bench [--op attention] [--n 384,640,768] [--d 16,32] [--heads 4] [--iters 20]\n"
                 "                 [--dtype bf16|fp16] [--bias-dtype same|fp32] [--no-compensate] [--no-dbias]\n"
                 "                 [--json]\n"
                 "       tpf bench --op trimul [--n 384,768,1024] [--c 128] [--ch 128]\n"
                 "                 [--direction outgoing|incoming] [--iters 20] [--json]\n\n"
                 "Times triangle attention forward and forward+backward (B=1, S=N, bf16 inputs and bias\n"
                 "unless --dtype / --bias-dtype say otherwise, 20% of keys masked): median of --iters\n"
                 "CUDA-event-timed calls after 3 warm-up calls. Prints ms, TFLOP/s (4 S H N^2 D forward,\n"
                 "14 S H N^2 D forward+backward) and the fraction of the exponential-unit floor (S H N^2\n"
                 "exponentials per pass at 4.16e12/s). With --op trimul: the triangle multiplicative\n"
                 "update (B=1, bf16, every bias), ms and TFLOP/s (forward: 2N^2 C(4Ch+C) + 2N^3 Ch +\n"
                 "2N^2 Ch C; forward+backward counted as 3x).\n"
                 "Needs a GPU."))
    return 0;
  // The arguments first, so that a mistyped one is reported on any machine.
  const std::string dtype_name = option(args, "--dtype", "bf16");
  const std::string bias_name = option(args, "--bias-dtype", "same");
  if ((dtype_name != "bf16" && dtype_name != "fp16") || (bias_name != "same" && bias_name != "fp32")) {
    std::fprintf(stderr, "tpf bench: --dtype takes bf16 or fp16, --bias-dtype same or fp32 (got %s, %s)\n",
                 dtype_name.c_str(), bias_name.c_str());
    return 2;
  }
  const DType dtype = dtype_name == "fp16" ? DType::kFP16 : DType::kBF16;
  const DType bias_dtype = bias_name == "fp32" ? DType::kFP32 : dtype;
  const std::string bias_label = bias_name == "fp32" ? "fp32" : dtype_name;
  if (!require_gpu("tpf bench")) return 1;
  if (option(args, "--op", "attention") == "trimul") return bench_trimul_cmd(args);
  const auto Ns = int_list(option(args, "--n", "384,640,768"));
  const auto Ds = int_list(option(args, "--d", "16,32"));
  const int H = std::stoi(option(args, "--heads", "4"));
  const int iters = std::stoi(option(args, "--iters", "20"));
  const bool comp = !has_flag(args, "--no-compensate");
  const bool dbias_on = !has_flag(args, "--no-dbias");
  std::vector<Result> rs;
  for (int D : Ds)
    for (int N : Ns) {
      rs.push_back(bench_attention(N, D, H, N, comp, dbias_on, iters, dtype, bias_dtype));
      if (!has_flag(args, "--json"))
        std::fprintf(stderr, "  done N=%d D=%d\n", N, D);
    }
  if (has_flag(args, "--json")) {
    std::printf("{\"gpu\": \"%s\", \"op\": \"triangle_attention\", \"B\": 1, \"H\": %d, \"dtype\": \"%s\", "
                "\"bias_dtype\": \"%s\", \"compensate\": %s, \"dbias\": %s, \"iters\": %d, \"results\": [\n",
                json_escape(gpu_name()).c_str(), H, dtype_name.c_str(), bias_label.c_str(),
                comp ? "true" : "false", dbias_on ? "true" : "false", iters);
    for (size_t i = 0; i < rs.size(); ++i) {
      const auto& r = rs[i];
      std::printf("  {\"N\": %d, \"S\": %d, \"D\": %d, \"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, "
                  "\"fwd_tflops\": %.1f, \"fwd_bwd_tflops\": %.1f, \"fwd_exp_floor_fraction\": %.3f, "
                  "\"fwd_bwd_exp_floor_fraction\": %.3f, \"workspace_mib\": %.1f}%s\n",
                  r.N, r.S, r.D, r.fwd_ms, r.fwdbwd_ms, r.fwd_tflops, r.fwdbwd_tflops,
                  r.fwd_floor_frac, r.fwdbwd_floor_frac, r.workspace_mib, i + 1 < rs.size() ? "," : "");
    }
    std::puts("]}");
  } else {
    std::printf("triangle attention on %s, B=1 H=%d S=N %s, bias %s, 20%% keys masked, compensate=%s, "
                "dbias=%s\n", gpu_name().c_str(), H, dtype_name.c_str(), bias_label.c_str(),
                comp ? "on" : "off", dbias_on ? "on" : "off");
    std::printf("%6s %4s %10s %9s %8s %12s %9s %8s %10s\n", "N", "D", "fwd ms", "TFLOP/s",
                "exp-fl", "fwd+bwd ms", "TFLOP/s", "exp-fl", "ws MiB");
    for (const auto& r : rs)
      std::printf("%6d %4d %10.3f %9.1f %8.2f %12.3f %9.1f %8.2f %10.1f\n", r.N, r.D, r.fwd_ms,
                  r.fwd_tflops, r.fwd_floor_frac, r.fwdbwd_ms, r.fwdbwd_tflops, r.fwdbwd_floor_frac,
                  r.workspace_mib);
  }
  return 0;
}

}  // namespace tpf::cli
