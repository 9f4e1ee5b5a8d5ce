#include "testing/gpu_trimul.h"

#include <string>

namespace tpf::harness {
namespace {

using test::TrimulProblem;

bool present(const TrimulProblem& p, int i) {
  const bool optional_bias = i == 3 || i == 5 || i == 9 || i == 11;
  return !optional_bias || p.biases;
}

}  // namespace

GpuRunResult run_trimul_gpu(TrimulProblem& p, bool backward, int repeats, bool from_saved) {
  GpuRunResult r;
  auto z = to_device(p.z, false), mask = to_device(p.mask, false), dout = to_device(p.dout, false);
  std::vector<DeviceTensor> w;
  for (int i = 0; i < TrimulProblem::kWeights; ++i) w.push_back(to_device(p.w[i], false));
  auto out = to_device(p.out, true);
  TrimulForwardParams f = p.fwd();
  f.z = z.view;
  if (p.has_mask) f.mask = mask.view;
  TensorView* fw[TrimulProblem::kWeights] = {
      &f.w.norm_in_weight, &f.w.norm_in_bias, &f.w.p_in_weight, &f.w.p_in_bias, &f.w.g_in_weight,
      &f.w.g_in_bias, &f.w.norm_out_weight, &f.w.norm_out_bias, &f.w.p_out_weight,
      &f.w.p_out_bias, &f.w.g_out_weight, &f.w.g_out_bias};
  for (int i = 0; i < TrimulProblem::kWeights; ++i)
    if (present(p, i)) *fw[i] = w[i].view;
  f.out = out.view;
  DeviceTensor residual, scale;
  if (p.residual.view.data) f.residual = (residual = to_device(p.residual, false)).view;
  if (p.scale.view.data) f.scale = (scale = to_device(p.scale, false)).view;
  size_t bytes = 0;
  DeviceBuffer saved;
  if (backward && from_saved) {
    if (!(r.status = trimul_saved_size(f, &f.saved_bytes)).ok()) return r;
    saved = DeviceBuffer(f.saved_bytes);
    cuda_ok(cudaMemset(saved.get(), 0xff, f.saved_bytes), "cudaMemset");  // the forward must fill it
    f.saved = saved.get();
  }
  auto run_forward = [&](const TrimulForwardParams& fp) {
    size_t ws_bytes = 0;
    if (!(r.status = trimul_forward_workspace_size(fp, &ws_bytes)).ok()) return false;
    DeviceBuffer ws(ws_bytes);
    cuda_ok(cudaMemset(ws.get(), 0xff, ws_bytes), "cudaMemset");  // stale workspace must not matter
    if (!(r.status = trimul_forward(fp, ws.get(), ws_bytes, nullptr)).ok()) return false;
    cuda_ok(cudaDeviceSynchronize(), "trimul forward");
    return true;
  };
  if (!run_forward(f)) return r;
  if (f.saved) {  // saving must not change the output: the inference forward's, bit for bit
    const std::vector<uint8_t> with_save = bytes_of(out);
    auto out2 = to_device(p.out, true);
    TrimulForwardParams inference = f;
    inference.saved = nullptr, inference.saved_bytes = 0, inference.out = out2.view;
    if (!run_forward(inference)) return r;
    if (bytes_of(out2) != with_save) {
      r.status = Status(StatusCode::kInvalidArgument,
                        "test harness: the saving forward's out differs from the inference forward's");
      return r;
    }
  }
  fetch(p.out, out);
  if (!backward) return r;

  TrimulBackwardParams b = p.bwd();
  b.fwd = f;
  b.dout = dout.view;
  std::vector<std::vector<uint8_t>> first;
  for (int rep = 0; rep < repeats; ++rep) {
    // dz poisoned, or holding dz_in where the call adds dz_in in place
    const bool alias = p.dz_in.view.data && p.dz_in_alias;
    auto dz = alias ? to_device(p.dz_in, false) : to_device(p.dz, true);
    DeviceTensor dz_in;
    if (p.dz_in.view.data) {
      if (!alias) dz_in = to_device(p.dz_in, false);
      b.dz_in = alias ? dz.view : dz_in.view;
    }
    std::vector<DeviceTensor> dw;
    for (int i = 0; i < TrimulProblem::kWeights; ++i) dw.push_back(to_device(p.dw[i], true));
    b.dz = dz.view;
    TensorView* g[TrimulProblem::kWeights] = {
        &b.dw.norm_in_weight, &b.dw.norm_in_bias, &b.dw.p_in_weight, &b.dw.p_in_bias,
        &b.dw.g_in_weight, &b.dw.g_in_bias, &b.dw.norm_out_weight, &b.dw.norm_out_bias,
        &b.dw.p_out_weight, &b.dw.p_out_bias, &b.dw.g_out_weight, &b.dw.g_out_bias};
    for (int i = 0; i < TrimulProblem::kWeights; ++i)
      if (present(p, i)) *g[i] = dw[i].view;
    if (!(r.status = trimul_backward_workspace_size(b, &bytes)).ok()) return r;
    DeviceBuffer ws(bytes);
    cuda_ok(cudaMemset(ws.get(), 0xff, bytes), "cudaMemset");
    if (!(r.status = trimul_backward(b, ws.get(), bytes, nullptr)).ok()) return r;
    cuda_ok(cudaDeviceSynchronize(), "trimul backward");
    std::vector<std::vector<uint8_t>> now = {bytes_of(dz)};
    for (auto& t : dw) now.push_back(bytes_of(t));
    if (rep == 0) {
      first = now;
      fetch(p.dz, dz);
      for (int i = 0; i < TrimulProblem::kWeights; ++i) fetch(p.dw[i], dw[i]);
    } else if (now != first) {
      r.deterministic = false;
    }
  }
  return r;
}

TrimulProblem trimul_fp64_copy(const TrimulProblem& p) {
  TrimulProblem q = p;
  for (auto* t : {&q.z, &q.mask, &q.out, &q.dout, &q.dz}) *t = t->copy_as(DType::kFP64);
  for (auto* t : {&q.residual, &q.scale})
    if (t->view.data) *t = t->copy_as(DType::kFP64);
  for (int i = 0; i < TrimulProblem::kWeights; ++i) {
    q.w[i] = p.w[i].copy_as(DType::kFP64);
    q.dw[i] = p.dw[i].copy_as(DType::kFP64);
  }
  return q;
}

ErrorTable trimul_errors(const TrimulProblem& got, const TrimulProblem& ref, bool backward) {
  ErrorTable e;
  e.add("out", got.out, ref.out, DType::kBF16);
  if (!backward) return e;
  e.add("dz", got.dz, ref.dz, DType::kBF16);
  for (int i = 0; i < TrimulProblem::kWeights; ++i)
    if (present(got, i))
      e.add((std::string("d_") + TrimulProblem::weight_name(i)).c_str(), got.dw[i], ref.dw[i],
            DType::kBF16);
  return e;
}

}  // namespace tpf::harness
