// The residual update: validation and CUDA entry points.
#include <string>

#include "common/cuda_check.h"
#include "common/validate.h"
#include "residual/kernels.h"
#include "turbopairformer/residual.h"

namespace tpf {
namespace {

using detail::Checker;
using detail::Dim;

const std::initializer_list<DType> kFloat = {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP64};

// t has `like`'s shape, contiguous, (GPU) 16-byte aligned.
Status check_like(const Checker& c, const char* arg, const TensorView& t, const TensorView& like, bool for_gpu) {
  TPF_RETURN_IF_ERROR(
      c.shape(arg, t, {{"B", like.shape[0]}, {"I", like.shape[1]}, {"J", like.shape[2]}, {"C", like.shape[3]}}));
  TPF_RETURN_IF_ERROR(c.contiguous(arg, t));
  return for_gpu ? c.aligned(arg, t, 16) : Status::Ok();
}

residual::Shape shape_of(const TensorView& t) { return {t.shape[0], t.shape[1], t.shape[2], t.shape[3]}; }

}  // namespace

Status validate_residual(const ResidualParams& p, bool backward, bool for_gpu) {
  const Checker c{backward ? "residual_backward" : "residual"};
  const TensorView& lead = backward ? p.dout : p.z;
  const char* lead_name = backward ? "dout" : "z";
  TPF_RETURN_IF_ERROR(c.shape(lead_name, lead, {{"B", -1}, {"I", -1}, {"J", -1}, {"C", -1}}));
  TPF_RETURN_IF_ERROR(c.dtype(lead_name, lead, kFloat));
  TPF_RETURN_IF_ERROR(check_like(c, lead_name, lead, lead, for_gpu));
  if (for_gpu && lead.shape[3] % 8 != 0)
    return c.fail(lead_name, "channel count C=" + std::to_string(lead.shape[3]) +
                                 " is not built for the GPU; supported: multiples of 8",
                  StatusCode::kUnsupported);
  const TensorView& u = backward ? p.du : p.u;
  const char* u_name = backward ? "du" : "u";
  TPF_RETURN_IF_ERROR(check_like(c, u_name, u, lead, for_gpu));
  TPF_RETURN_IF_ERROR(c.dtype(u_name, u, kFloat));
  if (for_gpu && !detail::mixed_pair(lead.dtype, u.dtype))
    return c.fail(u_name, std::string("dtype ") + dtype_name(u.dtype) + " with " + lead_name + " of dtype " +
                              dtype_name(lead.dtype) + " is not built for the GPU; supported: fp32 " + lead_name +
                              " with bf16, fp16 or fp32, or both in one 16-bit dtype",
                  StatusCode::kInvalidType);
  if (p.scale.present()) TPF_RETURN_IF_ERROR(c.scale("scale", p.scale, lead, {u.dtype}, for_gpu));
  if (backward) return Status::Ok();
  TPF_RETURN_IF_ERROR(check_like(c, "out", p.out, p.z, for_gpu));
  return c.dtype("out", p.out, {p.z.dtype});
}

Status residual_forward(const ResidualParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "residual";
  TPF_RETURN_IF_ERROR(validate_residual(p, false, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"z", p.z.data}, {"u", p.u.data}, {"scale", p.scale.data}, {"out", p.out.data}}));
  return detail::cuda_status(kOp, residual::forward(shape_of(p.z), p.z.dtype, p.u.dtype, p.z.data, p.u.data,
                                                    residual::scale_ref(p.scale), p.out.data, stream));
}

Status residual_backward(const ResidualParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "residual_backward";
  TPF_RETURN_IF_ERROR(validate_residual(p, true, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"dout", p.dout.data}, {"scale", p.scale.data}, {"du", p.du.data}}));
  return detail::cuda_status(kOp, residual::backward(shape_of(p.dout), p.dout.dtype, p.du.dtype, p.dout.data,
                                                     residual::scale_ref(p.scale), p.du.data, stream));
}

}  // namespace tpf
