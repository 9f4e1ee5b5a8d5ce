// tpf accuracy: the accuracy table of issue 3 (relative RMSE against FP64 and its ratio to the
// bf16 floor, compensation on and off) and the bitwise-determinism sweep. Needs a GPU.
#include <cstdio>
#include <sstream>

#include "cli/cli.h"
#include "testing/device_buffer.h"
#include "testing/device_attention.h"
#include "testing/gpu_attention.h"
#include "testing/gpu_reference.h"

namespace tpf::cli {
namespace {

using harness::cuda_ok;
using harness::DeviceBuffer;

struct Row {
  int N, D;
  bool compensate;
  double err[5], floor[5];
};
const char* kNames[5] = {"O", "dQ", "dK", "dV", "dbias"};

std::vector<Row> accuracy_rows(int N, int D, int H) {
  const int S = N;
  const int64_t x = int64_t{S} * H * N * D, rows = int64_t{S} * H * N;
  std::vector<Row> out_rows;
  for (bool comp : {true, false}) {
    // Same seed for both: identical inputs with compensation on and off. The FP64 reference is
    // recomputed for each (it costs well under a second).
    harness::DeviceAttention p(S, H, N, D, 1000 + N * 10 + D, 0.8, comp);
    DeviceBuffer r_out(x * 8), r_lse(rows * 8), r_delta(rows * 8), r_dq(x * 8), r_dk(x * 8),
        r_dv(x * 8), r_dbias(int64_t{H} * N * N * 8);
    harness::RefAttnDevice ref{p.fwd.q, p.fwd.k, p.fwd.v, p.fwd.bias, p.fwd.mask, p.bwd.dout,
                               1.0 / std::sqrt(double(D)),
                               static_cast<double*>(r_out.get()), static_cast<double*>(r_lse.get()),
                               static_cast<double*>(r_delta.get()), static_cast<double*>(r_dq.get()),
                               static_cast<double*>(r_dk.get()), static_cast<double*>(r_dv.get()),
                               static_cast<double*>(r_dbias.get())};
    cuda_ok(harness::reference_attention_device(ref), "reference");
    p.forward();
    p.backward();
    cuda_ok(cudaDeviceSynchronize(), "kernels");
    Row r{N, D, comp, {}, {}};
    const TensorView got[5] = {p.fwd.out, p.bwd.dq, p.bwd.dk, p.bwd.dv, p.bwd.dbias};
    const double* want[5] = {ref.out, ref.dq, ref.dk, ref.dv, ref.dbias};
    for (int i = 0; i < 5; ++i)
      cuda_ok(harness::relative_rmse_device(got[i], want[i], DType::kBF16, &r.err[i], &r.floor[i]),
              "rmse");
    out_rows.push_back(r);
  }
  return out_rows;
}

struct Determinism {
  int cases = 0, deterministic = 0, errors = 0;
  std::vector<std::string> failures;
};

Determinism determinism_sweep() {
  Determinism d;
  const int64_t Ns[] = {1, 7, 33, 64, 100, 129, 257};
  const int64_t Ds[] = {16, 32, 64, 128};
  for (int64_t N : Ns)
    for (int64_t D : Ds)
      for (int mask_mode = 0; mask_mode < 3; ++mask_mode)
        for (int layout = 0; layout < 2; ++layout)
          for (DType bias_dt : {DType::kBF16, DType::kFP32})
            for (uint64_t seed : {1ull, 2ull}) {
              const int64_t S = 1 + (seed + N) % 5;
              auto p = test::AttnProblem::random(
                  {1, S, 2, N, D}, seed * 7919 + N * 31 + D, DType::kBF16, bias_dt, 0.8,
                  layout ? std::vector<int>{0, 1, 3, 2, 4} : std::vector<int>{}, layout ? 8 : 0);
              p.has_mask = mask_mode != 0;
              if (mask_mode == 2) {  // the first slice fully masked
                auto m = p.mask.values();
                for (int64_t n = 0; n < N; ++n) m[n] = 0.0;
                p.mask.set_values(m);
              }
              harness::GpuRunOptions opt;
              opt.repeats = 5;
              const auto run = harness::run_attention_gpu(p, opt);
              ++d.cases;
              std::ostringstream name;
              name << "N=" << N << " D=" << D << " S=" << S << " mask=" << mask_mode
                   << " layout=" << layout << " bias=" << dtype_name(bias_dt) << " seed=" << seed;
              if (!run.status.ok()) {
                ++d.errors;
                d.failures.push_back(name.str() + ": " + run.status.message());
              } else if (run.deterministic) {
                ++d.deterministic;
              } else {
                d.failures.push_back(name.str() + ": gradients differ between calls");
              }
            }
  return d;
}

}  // namespace

int cmd_accuracy(const Args& args) {
  if (print_help(args,
                 "usage: tpf accuracy [--n 384,640,768] [--d 16,32] [--heads 4] [--out DIR]\n\n"
                 "Relative RMSE of O, dQ, dK, dV, dbias against an FP64 reference (B=1, S=N, bf16, 20% of\n"
                 "keys masked) with compensation on and off, and its ratio to the bf16 floor (the exact\n"
                 "answer rounded once to bf16); then the bitwise-determinism sweep (672 cases, 5 backward\n"
                 "calls each). Writes attention_accuracy.json and .md into DIR (default: the current\n"
                 "folder). Needs a GPU."))
    return 0;
  const auto Ns = int_list(option(args, "--n", "384,640,768"));
  const auto Ds = int_list(option(args, "--d", "16,32"));
  const int H = std::stoi(option(args, "--heads", "4"));
  const std::string dir = option(args, "--out", ".");
  if (!require_output_dir("tpf accuracy", dir) || !require_gpu("tpf accuracy")) return 1;
  std::vector<Row> rows;
  for (int N : Ns)
    for (int D : Ds) {
      std::fprintf(stderr, "  accuracy N=%d D=%d\n", N, D);
      for (const Row& r : accuracy_rows(N, D, H)) rows.push_back(r);
    }
  std::fprintf(stderr, "  determinism sweep\n");
  const Determinism det = determinism_sweep();

  std::ostringstream js, md;
  js << "{\n  \"gpu\": \"" << json_escape(gpu_name()) << "\",\n  \"setup\": \"B=1, H=" << H
     << ", S=N, bf16 inputs and bias, 20% of keys masked, FP64 reference on the same inputs\",\n"
     << "  \"metric\": \"relative RMSE ||x - x64|| / ||x64||; floor = same metric for bf16(x64)\",\n"
     << "  \"rows\": [\n";
  md << "# Triangle attention accuracy on " << gpu_name() << "\n\n"
     << "B=1, H=" << H << ", S=N, bf16 inputs and bias, 20% of keys masked. Relative RMSE against "
     << "an FP64 reference of the same inputs, and in parentheses its ratio to the bf16 floor "
     << "(the exact answer rounded once to bf16). Made by `scripts/device.sh accuracy`.\n\n"
     << "| N | D | compensation | O | dQ | dK | dV | dbias |\n|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << "    {\"N\": " << r.N << ", \"D\": " << r.D << ", \"compensate\": "
       << (r.compensate ? "true" : "false");
    md << "| " << r.N << " | " << r.D << " | " << (r.compensate ? "on" : "off");
    for (int j = 0; j < 5; ++j) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), ", \"%s\": {\"rel_rmse\": %.4e, \"floor\": %.4e, \"ratio\": %.3f}",
                    kNames[j], r.err[j], r.floor[j], r.err[j] / r.floor[j]);
      js << buf;
      std::snprintf(buf, sizeof(buf), " | %.3e (%.2f)", r.err[j], r.err[j] / r.floor[j]);
      md << buf;
    }
    js << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    md << " |\n";
  }
  js << "  ],\n  \"determinism\": {\"cases\": " << det.cases << ", \"calls_per_case\": 5, "
     << "\"bitwise_identical\": " << det.deterministic << ", \"errors\": " << det.errors
     << ", \"sweep\": \"N in {1,7,33,64,100,129,257} x D in {16,32,64,128} x mask {none, 20%, "
        "fully masked slice} x layout {[B,S,H,N,D], [B,S,N,H,D] padded} x bias {bf16, fp32} x "
        "2 seeds; S in 1..5\", \"failures\": [";
  for (size_t i = 0; i < det.failures.size(); ++i)
    js << (i ? ", " : "") << "\"" << json_escape(det.failures[i]) << "\"";
  js << "]}\n}\n";
  md << "\nBitwise determinism: " << det.deterministic << " of " << det.cases
     << " cases gave identical O, LSE, residual, dQ, dK, dV and dbias bytes over 5 forward and 5 "
        "backward calls (N in {1, 7, 33, "
        "64, 100, 129, 257} x D in {16, 32, 64, 128} x 3 mask patterns x 2 layouts x 2 bias "
        "dtypes x 2 seeds).\n";
  std::fputs(md.str().c_str(), stdout);
  if (!write_file(dir, "attention_accuracy.json", js.str()) || !write_file(dir, "attention_accuracy.md", md.str()))
    return 1;
  return det.deterministic == det.cases ? 0 : 1;
}

}  // namespace tpf::cli
