// Triangle multiplicative update CUDA entry points: validation, workspace, argument conversion.
#include <cmath>
#include <string>

#include "common/cuda_check.h"
#include "trimul/kernels.h"
#include "trimul/workspace.h"
#include "turbopairformer/trimul.h"

namespace tpf {
namespace {

using trimul::Dims;

constexpr uintptr_t kAlign = 256;

Dims dims(int64_t B, int64_t N, int64_t C, int64_t Ch) { return {B, N, (N + 7) / 8 * 8, C, Ch}; }

Dims dims_of(const TrimulForwardParams& p) {
  return dims(p.z.shape[0], p.z.shape[1], p.z.shape[3], p.w.p_in_weight.shape[0] / 2);
}

trimul::PairRef pair_ref(const TensorView& t) {
  return {t.data, t.stride[0], t.stride[1], t.stride[2]};
}

trimul::WeightSet weight_set(const TrimulWeights& w) {
  const TensorView* f[trimul::kNumWeights] = {
      &w.norm_in_weight, &w.norm_in_bias, &w.p_in_weight, &w.p_in_bias, &w.g_in_weight, &w.g_in_bias,
      &w.norm_out_weight, &w.norm_out_bias, &w.p_out_weight, &w.p_out_bias, &w.g_out_weight, &w.g_out_bias};
  trimul::WeightSet s;
  for (int i = 0; i < trimul::kNumWeights; ++i)
    s.w[i] = {f[i]->present() ? f[i]->data : nullptr, static_cast<int>(f[i]->dtype),
              f[i]->rank == 2 ? f[i]->stride[0] : 0};
  return s;
}

trimul::Problem problem_of(const TrimulForwardParams& f) {
  trimul::Problem p{};
  p.d = dims_of(f);
  p.z = pair_ref(f.z);
  p.out = pair_ref(f.out);
  p.mask = {f.mask.present() ? f.mask.data : nullptr, static_cast<int>(f.mask.dtype), f.mask.stride[0],
            f.mask.stride[1], f.mask.stride[2]};
  p.w = weight_set(f.w);
  p.outgoing = f.direction == TrimulDirection::kOutgoing;
  p.eps = static_cast<float>(f.eps);
  return p;
}

// Launch-geometry limits: the triangle product runs one grid layer per (batch, channel).
Status check_grid(const char* op, const Dims& d) {
  if (d.B * d.Ch > 65535)
    return Status(StatusCode::kUnsupported, std::string("tpf.") + op + ": argument 'z': B * Ch = " +
                                                std::to_string(d.B * d.Ch) +
                                                " exceeds 65535 (split the batch)");
  return Status::Ok();
}

Status check_workspace(const char* op, const char* query, size_t need, void* ws, size_t bytes) {
  if (bytes < need || (need > 0 && ws == nullptr))
    return Status(StatusCode::kWorkspaceTooSmall, std::string("tpf.") + op +
                                                      ": argument 'workspace': needs " +
                                                      std::to_string(need) + " bytes (" + query +
                                                      "), got " + std::to_string(bytes));
  if (reinterpret_cast<uintptr_t>(ws) % kAlign != 0)
    return Status(StatusCode::kInvalidArgument,
                  std::string("tpf.") + op + ": argument 'workspace': must be 256-byte aligned");
  return Status::Ok();
}

Status check_saved(const char* op, const TrimulForwardParams& f, size_t need) {
  if (f.saved == nullptr) return Status::Ok();
  if (f.saved_bytes < need)
    return Status(StatusCode::kInvalidArgument, std::string("tpf.") + op + ": argument 'saved': needs " +
                                                    std::to_string(need) + " bytes (trimul_saved_size), got " +
                                                    std::to_string(f.saved_bytes));
  if (reinterpret_cast<uintptr_t>(f.saved) % kAlign != 0)
    return Status(StatusCode::kInvalidArgument,
                  std::string("tpf.") + op + ": argument 'saved': must be 256-byte aligned");
  return Status::Ok();
}

Status check_pointers(const char* op, cudaStream_t stream, const TrimulForwardParams& f,
                      const TensorView& out, const TensorView& dout, void* ws,
                      const TensorView& dz_in = TensorView{}) {
  return detail::check_device_pointers(
      op, stream,
      {{"z", f.z.data}, {"mask", f.mask.data}, {"norm_in_weight", f.w.norm_in_weight.data},
       {"p_in_weight", f.w.p_in_weight.data}, {"g_in_weight", f.w.g_in_weight.data},
       {"norm_out_weight", f.w.norm_out_weight.data}, {"p_out_weight", f.w.p_out_weight.data},
       {"g_out_weight", f.w.g_out_weight.data}, {"out", out.data}, {"dout", dout.data},
       {"workspace", ws}, {"saved", f.saved}, {"dz_in", dz_in.data}, {"residual", f.residual.data},
       {"scale", f.scale.data}});
}

}  // namespace

Status trimul_forward_workspace_size(const TrimulForwardParams& p, size_t* bytes) {
  TPF_RETURN_IF_ERROR(validate_trimul_forward(p, /*for_gpu=*/true));
  // A workspace planned for a saving forward is smaller: the saved set lives in `saved`.
  *bytes = trimul::plan_forward(dims_of(p), nullptr, p.saved != nullptr, nullptr).bytes;
  return Status::Ok();
}

Status trimul_backward_workspace_size(const TrimulBackwardParams& p, size_t* bytes) {
  TPF_RETURN_IF_ERROR(validate_trimul_backward(p, /*for_gpu=*/true));
  *bytes = trimul::plan_backward(dims_of(p.fwd), nullptr, p.fwd.saved != nullptr, nullptr).bytes;
  return Status::Ok();
}

Status trimul_saved_size(const TrimulForwardParams& p, size_t* bytes) {
  TPF_RETURN_IF_ERROR(validate_trimul_forward(p, /*for_gpu=*/true));
  *bytes = trimul::saved_size(dims_of(p));
  return Status::Ok();
}

size_t trimul_saved_bytes(int64_t B, int64_t N, int64_t C, int64_t Ch) {
  if (B < 1 || N < 1 || C < 1 || Ch < 1) return 0;
  return trimul::saved_size(dims(B, N, C, Ch));
}

Status trimul_forward(const TrimulForwardParams& p, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  constexpr const char* kOp = "triangle_multiplicative_update";
  TPF_RETURN_IF_ERROR(validate_trimul_forward(p, /*for_gpu=*/true));
  const Dims d = dims_of(p);
  TPF_RETURN_IF_ERROR(check_grid(kOp, d));
  const trimul::Workspace ws = trimul::plan_forward(d, workspace, p.saved != nullptr, p.saved);
  TPF_RETURN_IF_ERROR(check_workspace(kOp, "trimul_forward_workspace_size", ws.bytes, workspace,
                                      workspace_bytes));
  TPF_RETURN_IF_ERROR(check_saved(kOp, p, trimul::saved_size(d)));
  TPF_RETURN_IF_ERROR(check_pointers(kOp, stream, p, p.out, TensorView{}, workspace));
  trimul::Problem pr = problem_of(p);
  pr.res = {p.residual.present() ? p.residual.data : nullptr, p.residual.dtype == DType::kFP32,
            residual::scale_ref(p.scale)};
  return detail::cuda_status(kOp, trimul::run_forward(pr, ws, stream));
}

Status trimul_backward(const TrimulBackwardParams& p, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream) {
  constexpr const char* kOp = "triangle_multiplicative_update_backward";
  TPF_RETURN_IF_ERROR(validate_trimul_backward(p, /*for_gpu=*/true));
  const Dims d = dims_of(p.fwd);
  TPF_RETURN_IF_ERROR(check_grid(kOp, d));
  const trimul::Workspace ws = trimul::plan_backward(d, workspace, p.fwd.saved != nullptr, p.fwd.saved);
  TPF_RETURN_IF_ERROR(check_workspace(kOp, "trimul_backward_workspace_size", ws.bytes, workspace,
                                      workspace_bytes));
  TPF_RETURN_IF_ERROR(check_saved(kOp, p.fwd, trimul::saved_size(d)));
  TPF_RETURN_IF_ERROR(check_pointers(kOp, stream, p.fwd, p.dz, p.dout, workspace, p.dz_in));
  trimul::Problem pr = problem_of(p.fwd);
  pr.dout = pair_ref(p.dout);
  pr.dz = pair_ref(p.dz);
  pr.dz_in = pair_ref(p.dz_in);
  pr.dz_f32 = p.dz.dtype == DType::kFP32;
  pr.dw = weight_set(p.dw);
  return detail::cuda_status(kOp, trimul::run_backward(pr, ws, p.fwd.saved == nullptr, stream));
}

}  // namespace tpf
