// tpf trimul-table: the multiplicative update's table of issue 5 (time, device memory and
// accuracy against FP64, forward and forward+backward) at C = Ch = 128. Needs a GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <sstream>

#include "cli/cli.h"
#include "testing/device_trimul.h"
#include "testing/gpu_trimul.h"

namespace tpf::cli {
namespace {

struct TableRow {
  int N;
  double fwd_ms, fwdbwd_ms, fwd_mib, fwdbwd_mib;
  double recompute_ms = 0, recompute_mib = 0;  // forward+backward without a saved set
  bool has_acc = false, deterministic = true;
  harness::ErrorTable err;
};

TableRow measure(int N, int C, bool outgoing, int iters, bool accuracy) {
  TableRow r{N, 0, 0, 0, 0};
  {
    harness::DeviceTrimul p(1, N, C, C, outgoing, 7 + N);
    r.fwd_ms = median_ms([&] { p.forward(); }, 3, iters);
    r.fwdbwd_ms = median_ms([&] { p.forward_saving(); p.backward(); }, 3, iters);
    r.recompute_ms = median_ms([&] { p.forward(); p.backward_recompute(); }, 3, iters);
    // Device memory the calls hold: tensors and workspaces (weights are negligible); training
    // holds the saved set from the forward through the backward.
    const double act = double(N) * N * C * 2;
    r.fwd_mib = (2 * act + N * double(N) + p.fwd_bytes) / 1048576.0;
    r.fwdbwd_mib = (4 * act + N * double(N) + p.saved_bytes +
                    std::max(p.fwd_saving_bytes, p.bwd_saved_bytes)) / 1048576.0;
    r.recompute_mib = (4 * act + N * double(N) + std::max(p.fwd_bytes, p.bwd_bytes)) / 1048576.0;
  }
  if (accuracy) {
    auto prob = test::TrimulProblem::random(1, N, C, C, 11 + N, DType::kBF16, DType::kBF16);
    prob.direction = outgoing ? TrimulDirection::kOutgoing : TrimulDirection::kIncoming;
    auto ref = harness::trimul_fp64_copy(prob);
    reference::trimul_forward(ref.fwd());
    reference::trimul_backward(ref.bwd());
    const auto run = harness::run_trimul_gpu(prob, true, 2);
    if (!run.status.ok()) throw std::runtime_error(run.status.message());
    r.has_acc = true;
    r.deterministic = run.deterministic;
    r.err = harness::trimul_errors(prob, ref, true);
  }
  return r;
}

}  // namespace

int cmd_trimul_table(const Args& args) {
  if (print_help(args,
                 "usage: tpf trimul-table [--n 384,768,1024,2048] [--c 128] [--ref-max-n 768]\n"
                 "                        [--direction outgoing|incoming] [--iters 20] [--out DIR]\n\n"
                 "Triangle multiplicative update, B=1, C=Ch, bf16 z and weights, every bias: median time\n"
                 "of the forward (inference) and of forward+backward (training: the forward saves what the\n"
                 "backward needs; also without saving, the backward recomputing), CUDA events, 3 warm-up\n"
                 "calls; the device memory the calls hold (tensors + workspaces + saved set), and for N <= --ref-max-n the relative RMSE of out, dz and\n"
                 "every weight gradient against the FP64 CPU reference with its ratio to the bf16 floor,\n"
                 "plus bitwise determinism over 2 backward calls (the reference costs ~1 minute at N = 768\n"
                 "on 16 cores, several at 1024). Writes trimul.json and trimul.md into DIR."))
    return 0;
  const auto Ns = int_list(option(args, "--n", "384,768,1024,2048"));
  const int C = std::stoi(option(args, "--c", "128"));
  const int ref_max = std::stoi(option(args, "--ref-max-n", "768"));
  const int iters = std::stoi(option(args, "--iters", "20"));
  const bool outgoing = option(args, "--direction", "outgoing") != "incoming";
  const std::string dir = option(args, "--out", ".");
  if (!require_output_dir("tpf trimul-table", dir) || !require_gpu("tpf trimul-table")) return 1;
  std::vector<TableRow> rows;
  for (int N : Ns) {
    std::fprintf(stderr, "  trimul N=%d%s\n", N, N <= ref_max ? " (with FP64 reference)" : "");
    rows.push_back(measure(N, C, outgoing, iters, N <= ref_max));
  }
  std::ostringstream js, md;
  js << "{\n  \"gpu\": \"" << json_escape(gpu_name()) << "\",\n  \"setup\": \"B=1, C=Ch=" << C
     << ", " << (outgoing ? "outgoing" : "incoming")
     << ", bf16 z and weights, every bias, 20% of pairs masked (accuracy) / 10% (timing)\",\n"
     << "  \"metric\": \"relative RMSE ||x - x64|| / ||x64||; floor = same metric for bf16(x64); "
        "time: median of CUDA-event-timed calls\",\n  \"rows\": [\n";
  md << "# Triangle multiplicative update on " << gpu_name() << "\n\n"
     << "B=1, C = Ch = " << C << ", " << (outgoing ? "outgoing" : "incoming")
     << ", bf16 z and weights, every bias. Time: median of " << iters
     << " CUDA-event-timed calls after 3 warm-ups. fwd: inference (nothing saved); fwd+bwd: "
        "training (the forward saves what the backward needs, the backward reads it); recompute: "
        "forward+backward without the saved set (the backward recomputes the forward). Memory: "
        "what the calls hold on the device (tensors, workspaces, saved set). Accuracy: relative RMSE against the FP64 CPU reference on "
        "the same inputs, in parentheses its ratio to the bf16 floor (the exact answer rounded "
        "once to bf16); 'worst weight' is the largest ratio over the 12 weight gradients. "
        "Made by `tpf trimul-table`.\n\n"
     << "| N | fwd ms | fwd MiB | fwd+bwd ms | fwd+bwd MiB | recompute ms | recompute MiB | out | dz | "
        "worst weight grad | deterministic |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const TableRow& r = rows[i];
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "    {\"N\": %d, \"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"fwd_mib\": %.1f, "
                  "\"fwd_bwd_mib\": %.1f, \"fwd_bwd_recompute_ms\": %.4f, \"fwd_bwd_recompute_mib\": %.1f",
                  r.N, r.fwd_ms, r.fwdbwd_ms, r.fwd_mib, r.fwdbwd_mib, r.recompute_ms, r.recompute_mib);
    js << buf;
    std::snprintf(buf, sizeof(buf), "| %d | %.3f | %.0f | %.3f | %.0f | %.3f | %.0f |", r.N, r.fwd_ms,
                  r.fwd_mib, r.fwdbwd_ms, r.fwdbwd_mib, r.recompute_ms, r.recompute_mib);
    md << buf;
    if (r.has_acc) {
      js << ", \"deterministic\": " << (r.deterministic ? "true" : "false") << ", \"accuracy\": {";
      double worst = 0;
      std::string worst_name;
      for (size_t k = 0; k < r.err.names.size(); ++k) {
        const double ratio = r.err.error[k] / r.err.floor[k];
        std::snprintf(buf, sizeof(buf), "%s\"%s\": {\"rel_rmse\": %.4e, \"floor\": %.4e, \"ratio\": %.3f}",
                      k ? ", " : "", r.err.names[k].c_str(), r.err.error[k], r.err.floor[k], ratio);
        js << buf;
        if (k >= 2 && ratio > worst) worst = ratio, worst_name = r.err.names[k];
      }
      js << "}";
      std::snprintf(buf, sizeof(buf), " %.2e (%.2f) | %.2e (%.2f) | %.2f (%s) | %s |\n",
                    r.err.error[0], r.err.error[0] / r.err.floor[0], r.err.error[1],
                    r.err.error[1] / r.err.floor[1], worst, worst_name.c_str(),
                    r.deterministic ? "yes" : "NO");
      md << buf;
    } else {
      md << " not measured (FP64 CPU reference too slow at this N) | | | |\n";
    }
    js << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  std::fputs(md.str().c_str(), stdout);
  return write_file(dir, "trimul.json", js.str()) && write_file(dir, "trimul.md", md.str()) ? 0 : 1;
}

}  // namespace tpf::cli
