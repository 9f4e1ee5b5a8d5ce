// tpf accuracy: the accuracy table of issue 3 (relative RMSE against FP64 and its ratio to the
// bf16 floor, compensation on and off) and the bitwise-determinism sweep. Needs a GPU.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "testing/device_buffer.h"
#include "testing/device_random.h"
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

void check(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.message());
}

std::vector<Row> accuracy_rows(int N, int D, int H) {
  const int S = N;
  const DType bf = DType::kBF16;
  const int64_t x = int64_t{S} * H * N * D, rows = int64_t{S} * H * N;
  DeviceBuffer q(x * 2), k(x * 2), v(x * 2), dout(x * 2), out(x * 2), res(x * 2), dq(x * 2),
      dk(x * 2), dv(x * 2), bias(int64_t{H} * N * N * 2), dbias(int64_t{H} * N * N * 2),
      mask(int64_t{S} * N), lse(rows * 4);
  uint64_t seed = 1000 + N * 10 + D;
  for (auto* b : {&q, &k, &v, &dout, &bias})
    cuda_ok(harness::fill_normal_device(b->get(), bf, b->bytes() / 2, seed++), "fill");
  cuda_ok(harness::fill_mask_device(static_cast<uint8_t*>(mask.get()), int64_t{S} * N, 0.8, seed), "fill");
  auto view = [&](DeviceBuffer& b) { return contiguous_view(b.get(), bf, {1, S, H, N, D}); };
  const TensorView bias_v = contiguous_view(bias.get(), bf, {1, 1, H, N, N});
  const TensorView mask_v = contiguous_view(mask.get(), DType::kBool, {1, S, 1, 1, N});

  // FP64 reference of the same (bf16-valued) inputs.
  DeviceBuffer r_out(x * 8), r_lse(rows * 8), r_delta(rows * 8), r_dq(x * 8), r_dk(x * 8),
      r_dv(x * 8), r_dbias(int64_t{H} * N * N * 8);
  harness::RefAttnDevice ref{view(q), view(k), view(v), bias_v, mask_v, view(dout),
                             1.0 / std::sqrt(double(D)),
                             static_cast<double*>(r_out.get()), static_cast<double*>(r_lse.get()),
                             static_cast<double*>(r_delta.get()), static_cast<double*>(r_dq.get()),
                             static_cast<double*>(r_dk.get()), static_cast<double*>(r_dv.get()),
                             static_cast<double*>(r_dbias.get())};
  cuda_ok(harness::reference_attention_device(ref), "reference");
  cuda_ok(cudaDeviceSynchronize(), "reference");

  std::vector<Row> out_rows;
  for (bool comp : {true, false}) {
    AttentionForwardParams f;
    f.q = view(q);
    f.k = view(k);
    f.v = view(v);
    f.bias = bias_v;
    f.mask = mask_v;
    f.out = view(out);
    f.out_residual = view(res);
    f.lse = contiguous_view(lse.get(), DType::kFP32, {1, S, H, N});
    f.compensate = comp;
    check(attention_forward(f, nullptr));
    AttentionBackwardParams b;
    b.q = f.q;
    b.k = f.k;
    b.v = f.v;
    b.bias = f.bias;
    b.mask = f.mask;
    b.out = f.out;
    b.out_residual = f.out_residual;
    b.lse = f.lse;
    b.dout = view(dout);
    b.dq = view(dq);
    b.dk = view(dk);
    b.dv = view(dv);
    b.dbias = contiguous_view(dbias.get(), bf, {1, 1, H, N, N});
    b.compensate = comp;
    size_t ws_bytes = 0;
    check(attention_backward_workspace_size(b, &ws_bytes));
    DeviceBuffer ws(ws_bytes);
    check(attention_backward(b, ws.get(), ws_bytes, nullptr));
    cuda_ok(cudaDeviceSynchronize(), "kernels");
    Row r{N, D, comp, {}, {}};
    const TensorView got[5] = {f.out, b.dq, b.dk, b.dv, b.dbias};
    const double* want[5] = {ref.out, ref.dq, ref.dk, ref.dv, ref.dbias};
    for (int i = 0; i < 5; ++i)
      cuda_ok(harness::relative_rmse_device(got[i], want[i], bf, &r.err[i], &r.floor[i]), "rmse");
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
  if (has_flag(args, "--help")) {
    std::puts(
        "usage: tpf accuracy [--n 384,640,768] [--d 16,32] [--heads 4] [--out DIR]\n\n"
        "Relative RMSE of O, dQ, dK, dV, dbias against an FP64 reference (B=1, S=N, bf16, 20% of\n"
        "keys masked) with compensation on and off, and its ratio to the bf16 floor (the exact\n"
        "answer rounded once to bf16); then the bitwise-determinism sweep (672 cases, 5 backward\n"
        "calls each). Writes attention_accuracy.json and .md into DIR (default: the current\n"
        "folder). Needs a GPU.");
    return 0;
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "tpf accuracy: no CUDA GPU found.\n");
    return 1;
  }
  const auto Ns = int_list(option(args, "--n", "384,640,768"));
  const auto Ds = int_list(option(args, "--d", "16,32"));
  const int H = std::stoi(option(args, "--heads", "4"));
  const std::string dir = option(args, "--out", ".");
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
     << "(the exact answer rounded once to bf16). Made by `scripts/attention_accuracy.sh`.\n\n"
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
     << " cases gave identical dQ, dK, dV and dbias bytes over 5 backward calls (N in {1, 7, 33, "
        "64, 100, 129, 257} x D in {16, 32, 64, 128} x 3 mask patterns x 2 layouts x 2 bias "
        "dtypes x 2 seeds).\n";
  std::ofstream(dir + "/attention_accuracy.json") << js.str();
  std::ofstream(dir + "/attention_accuracy.md") << md.str();
  std::fputs(md.str().c_str(), stdout);
  return det.deterministic == det.cases ? 0 : 1;
}

}  // namespace tpf::cli
