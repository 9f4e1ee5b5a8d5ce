// LayerNorm CUDA entry points: validation, workspace, argument conversion.
#include <string>

#include "common/cuda_check.h"
#include "norm/kernels.h"
#include "turbopairformer/layer_norm.h"

namespace tpf {
namespace {

constexpr uintptr_t kAlign = 256;

norm::Rows rows_of(const LayerNormForwardParams& p) {
  const int64_t W = p.x.shape[p.x.rank - 1];
  return {p.x.numel() / W, static_cast<int>(W), static_cast<float>(p.eps)};
}

norm::Param param(const TensorView& t) { return {t.present() ? t.data : nullptr, t.dtype}; }
norm::Grad grad(const TensorView& t) { return {t.present() ? t.data : nullptr, t.dtype}; }
float* f32(const TensorView& t) { return t.present() ? static_cast<float*>(t.data) : nullptr; }

size_t workspace_bytes_of(const LayerNormBackwardParams& p) {
  if (!p.dweight.present() && !p.dbias.present()) return 0;
  return norm::backward_partials_bytes(rows_of(p.fwd));
}

}  // namespace

Status layer_norm_forward(const LayerNormForwardParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "layer_norm";
  TPF_RETURN_IF_ERROR(validate_layer_norm_forward(p, /*for_gpu=*/true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"x", p.x.data}, {"weight", p.weight.data}, {"bias", p.bias.data}, {"y", p.y.data},
                    {"mean", p.mean.data}, {"rstd", p.rstd.data}}));
  return detail::cuda_status(kOp, norm::forward(rows_of(p), p.x.data, p.x.dtype, param(p.weight), param(p.bias),
                                                p.y.data, p.y.dtype, f32(p.mean), f32(p.rstd), stream));
}

Status layer_norm_backward_workspace_size(const LayerNormBackwardParams& p, size_t* bytes) {
  TPF_RETURN_IF_ERROR(validate_layer_norm_backward(p, /*for_gpu=*/true));
  *bytes = workspace_bytes_of(p);
  return Status::Ok();
}

Status layer_norm_backward(const LayerNormBackwardParams& p, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  constexpr const char* kOp = "layer_norm_backward";
  TPF_RETURN_IF_ERROR(validate_layer_norm_backward(p, /*for_gpu=*/true));
  const size_t need = workspace_bytes_of(p);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr))
    return Status(StatusCode::kWorkspaceTooSmall, std::string("tpf.") + kOp + ": argument 'workspace': needs " +
                                                      std::to_string(need) +
                                                      " bytes (layer_norm_backward_workspace_size), got " +
                                                      std::to_string(workspace_bytes));
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0)
    return Status(StatusCode::kInvalidArgument,
                  std::string("tpf.") + kOp + ": argument 'workspace': must be 256-byte aligned");
  const LayerNormForwardParams& f = p.fwd;
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"x", f.x.data}, {"weight", f.weight.data}, {"mean", f.mean.data}, {"rstd", f.rstd.data},
                    {"dy", p.dy.data}, {"dx", p.dx.data}, {"dx_in", p.dx_in.data}, {"dweight", p.dweight.data},
                    {"dbias", p.dbias.data}, {"workspace", need ? workspace : nullptr}}));
  return detail::cuda_status(
      kOp, norm::backward(rows_of(f), f.x.data, f.x.dtype, p.dy.data, p.dy.dtype, param(f.weight), f32(f.mean),
                          f32(f.rstd), p.dx.data, p.dx_in.data, grad(p.dweight), grad(p.dbias), static_cast<float*>(workspace),
                          stream));
}

}  // namespace tpf
