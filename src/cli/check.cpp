// tpf check: the FP64 reference's self-checks (finite differences, mask semantics) and, with a
// GPU, the CUDA kernels against the reference (accuracy over the floor, determinism).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cli/cli.h"
#include "testing/attention_problem.h"
#include "testing/finite_diff.h"
#include "testing/gpu_attention.h"
#include "testing/gpu_trimul.h"
#include "testing/tolerances.h"
#include "testing/trimul_problem.h"

namespace tpf::cli {
namespace {

struct Row {
  std::string name;
  bool ok;
  std::string detail;
};

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

void reference_attention_checks(std::vector<Row>& rows) {
  using test::AttnProblem;
  using test::HostTensor;
  struct G {
    const char* name;
    HostTensor AttnProblem::*x, AttnProblem::*dx;
  };
  for (const G& g : {G{"dq", &AttnProblem::q, &AttnProblem::dq}, G{"dk", &AttnProblem::k, &AttnProblem::dk},
                     G{"dv", &AttnProblem::v, &AttnProblem::dv}, G{"dbias", &AttnProblem::bias, &AttnProblem::dbias}}) {
    auto p = AttnProblem::random({1, 3, 2, 5, 4}, 42);
    const bool ok_f = reference::attention_forward(p.fwd()).ok() &&
                      reference::attention_backward(p.bwd()).ok();
    const double err = harness::finite_difference_error(p.*g.x, (p.*g.dx).values(), [&] {
      reference::attention_forward(p.fwd());
      return harness::dot(p.out, p.dout);
    });
    rows.push_back({std::string("reference attention ") + g.name + " vs finite differences",
                    ok_f && err < 1e-6, fmt("max rel diff %.1e (bound 1e-6)", err)});
  }
  // Keys with mask = false must not change the output; fully masked rows give zeros.
  auto p = AttnProblem::random({1, 2, 2, 6, 4}, 43);
  auto m = p.mask.values();
  for (int n = 0; n < 6; ++n) m[n] = 0.0;
  m[6] = 0.0;
  p.mask.set_values(m);
  reference::attention_forward(p.fwd());
  const auto before = p.out.values();
  p.v.for_each([&](int64_t i, int64_t off) {
    const int64_t n = (i / 4) % 6, s = i / (4 * 6 * 2);
    if (m[s * 6 + n] == 0.0) p.v.set(off, 100.0);
  });
  reference::attention_forward(p.fwd());
  bool zeros = true;
  for (int i = 0; i < 2 * 6 * 4; ++i) zeros = zeros && p.out.values()[i] == 0.0;
  rows.push_back({"reference attention masked keys ignored, masked rows zero",
                  test::max_abs_diff(before, p.out.values()) == 0.0 && zeros, "exact"});
}

void reference_trimul_checks(std::vector<Row>& rows) {
  for (auto dir : {TrimulDirection::kOutgoing, TrimulDirection::kIncoming}) {
    double worst = 0.0;
    for (int which = -1; which < test::TrimulProblem::kWeights; ++which) {
      auto p = test::TrimulProblem::random(1, 4, 3, 2, 50 + which);
      p.direction = dir;
      reference::trimul_backward(p.bwd());
      auto& x = which < 0 ? p.z : p.w[which];
      const auto analytic = (which < 0 ? p.dz : p.dw[which]).values();
      worst = std::max(worst, harness::finite_difference_error(x, analytic, [&] {
                         reference::trimul_forward(p.fwd());
                         return harness::dot(p.out, p.dout);
                       }));
    }
    rows.push_back({std::string("reference trimul ") +
                        (dir == TrimulDirection::kOutgoing ? "outgoing" : "incoming") +
                        " dz + 12 weight grads vs finite differences",
                    worst < 2e-6, fmt("max rel diff %.1e (bound 2e-6)", worst)});
  }
}

void gpu_attention_checks(std::vector<Row>& rows) {
  struct C {
    int64_t S, N, D;
    DType act;
  };
  for (const C& c : {C{3, 7, 16, DType::kBF16}, C{3, 100, 32, DType::kBF16}, C{2, 333, 64, DType::kBF16},
                     C{2, 129, 128, DType::kBF16}, C{4, 96, 32, DType::kFP16}}) {
    auto p = test::AttnProblem::random({1, c.S, 2, c.N, c.D}, 7 + c.N, c.act, DType::kFP32);
    auto ref = p.to_fp64();
    reference::attention_forward(ref.fwd());
    reference::attention_backward(ref.bwd());
    harness::GpuRunOptions opt;
    opt.repeats = 5;
    const auto run = harness::run_attention_gpu(p, opt);
    std::ostringstream name;
    name << "GPU attention " << (c.act == DType::kFP16 ? "fp16" : "bf16") << " S=" << c.S
         << " N=" << c.N << " D=" << c.D;
    if (!run.status.ok()) {
      rows.push_back({name.str(), false, run.status.message()});
      continue;
    }
    const auto e = harness::attention_errors(p, ref, true);
    bool ok = run.deterministic;
    std::ostringstream d;
    d << "err/floor";
    for (size_t i = 0; i < e.names.size(); ++i) {
      const double ratio = e.error[i] / e.floor[i];
      ok = ok && ratio <= (i == 0 ? harness::kOutFloorFactor : harness::kGradFloorFactor);
      d << " " << e.names[i] << " " << fmt("%.2f", ratio);
    }
    d << (run.deterministic ? "; 5 calls bitwise identical" : "; NOT DETERMINISTIC");
    rows.push_back({name.str(), ok, d.str()});
  }
}

void gpu_trimul_checks(std::vector<Row>& rows) {
  struct C {
    int64_t B, N, C, Ch;
    bool outgoing;
    DType weights;
  };
  for (const C& c : {C{1, 7, 64, 64, true, DType::kBF16}, C{1, 100, 128, 128, false, DType::kBF16},
                     C{2, 57, 96, 32, true, DType::kFP32}}) {
    auto p = test::TrimulProblem::random(c.B, c.N, c.C, c.Ch, 90 + c.N, DType::kBF16, c.weights);
    p.direction = c.outgoing ? TrimulDirection::kOutgoing : TrimulDirection::kIncoming;
    auto ref = harness::trimul_fp64_copy(p);
    reference::trimul_forward(ref.fwd());
    reference::trimul_backward(ref.bwd());
    const auto run = harness::run_trimul_gpu(p, true, 5);
    std::ostringstream name;
    name << "GPU trimul " << (c.outgoing ? "outgoing" : "incoming") << " B=" << c.B << " N=" << c.N
         << " C=" << c.C << " Ch=" << c.Ch << (c.weights == DType::kFP32 ? " fp32 w" : "");
    if (!run.status.ok()) {
      rows.push_back({name.str(), false, run.status.message()});
      continue;
    }
    const auto e = harness::trimul_errors(p, ref, true);
    bool ok = run.deterministic;
    double worst = 0;
    for (size_t i = 0; i < e.names.size(); ++i) {
      const double ratio = e.error[i] / e.floor[i];
      ok = ok && ratio <= (i == 0 ? harness::kTrimulOutFloorFactor : harness::kTrimulGradFloorFactor);
      if (i >= 2) worst = std::max(worst, ratio);
    }
    std::ostringstream d;
    d << "err/floor out " << fmt("%.2f", e.error[0] / e.floor[0]) << " dz "
      << fmt("%.2f", e.error[1] / e.floor[1]) << " weights <= " << fmt("%.2f", worst)
      << (run.deterministic ? "; 5 calls bitwise identical" : "; NOT DETERMINISTIC");
    rows.push_back({name.str(), ok, d.str()});
  }
}

}  // namespace

int cmd_check(const Args& args) {
  if (print_help(args,
                 "usage: tpf check [--json] [--cpu-only]\n\n"
                 "Runs the FP64 CPU reference's self-checks (gradients against finite differences, mask\n"
                 "semantics) and, when a GPU is present, the CUDA kernels against the reference: relative\n"
                 "RMSE over the bf16 floor and bitwise determinism over 5 calls. Exits 1 on any failure."))
    return 0;
  std::vector<Row> rows;
  reference_attention_checks(rows);
  reference_trimul_checks(rows);
  const bool gpu = cuda_device_count() > 0 && !has_flag(args, "--cpu-only");
  if (gpu) {
    gpu_attention_checks(rows);
    gpu_trimul_checks(rows);
  }
  bool all_ok = true;
  for (const auto& r : rows) all_ok = all_ok && r.ok;
  if (has_flag(args, "--json")) {
    std::printf("{\"ok\": %s, \"gpu\": \"%s\", \"checks\": [\n", all_ok ? "true" : "false",
                json_escape(gpu_name()).c_str());
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("  {\"name\": \"%s\", \"ok\": %s, \"detail\": \"%s\"}%s\n",
                  json_escape(rows[i].name).c_str(), rows[i].ok ? "true" : "false",
                  json_escape(rows[i].detail).c_str(), i + 1 < rows.size() ? "," : "");
    std::puts("]}");
  } else {
    std::printf("%-64s %-5s %s\n", "check", "", "detail");
    for (const auto& r : rows)
      std::printf("%-64s %-5s %s\n", r.name.c_str(), r.ok ? "ok" : "FAIL", r.detail.c_str());
    if (!gpu)
      std::printf("\nGPU checks skipped: %s\n", cuda_device_count() == 0
                                                    ? "no CUDA GPU on this machine"
                                                    : "--cpu-only given");
    std::printf("\n%s: %zu checks\n", all_ok ? "all passed" : "FAILURES", rows.size());
  }
  return all_ok ? 0 : 1;
}

}  // namespace tpf::cli
