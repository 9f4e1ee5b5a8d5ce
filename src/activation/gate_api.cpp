// The sigmoid gate: validation and CUDA entry points (the kernels are the gated activations').
#include <string>

#include "activation/kernels.h"
#include "common/cuda_check.h"
#include "common/validate.h"
#include "turbopairformer/gate.h"

namespace tpf {
namespace {

using detail::Checker;

// t is [R, W] in g's dtype with a unit last stride (and 16-byte rows on the GPU); an output
// must also be writable.
Status check_rows(const Checker& c, const char* arg, const TensorView& t, const TensorView& g, bool output,
                  bool for_gpu) {
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"R", g.shape[0]}, {"W", g.shape[1]}}));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, {g.dtype}));
  TPF_RETURN_IF_ERROR(c.unit_last_stride(arg, t));
  if (output && t.shape[0] > 1 && t.stride[0] < t.shape[1])
    return c.fail(arg, "is an output but its rows overlap (row stride " + std::to_string(t.stride[0]) + " < W=" +
                           std::to_string(t.shape[1]) + "); outputs need distinct elements");
  return for_gpu ? c.aligned(arg, t, 16) : Status::Ok();
}

act::Rows rows(const TensorView& t) { return {t.data, t.stride[0]}; }

act::Shape shape_of(const SigmoidGateParams& p) {
  return {act::Gate::kSigmoid, p.g.shape[0], p.g.shape[1], p.g.dtype};
}

}  // namespace

Status validate_sigmoid_gate(const SigmoidGateParams& p, bool backward, bool for_gpu) {
  const Checker c{backward ? "sigmoid_gate_backward" : "sigmoid_gate"};
  TPF_RETURN_IF_ERROR(c.shape("g", p.g, {{"R", -1}, {"W", -1}}));
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64("g", p.g, {DType::kBF16, DType::kFP16, DType::kFP32}, !for_gpu));
  if (for_gpu && p.g.shape[1] % 8 != 0)
    return c.fail("g", "width W=" + std::to_string(p.g.shape[1]) +
                           " is not built for the GPU; supported: multiples of 8",
                  StatusCode::kUnsupported);
  TPF_RETURN_IF_ERROR(check_rows(c, "g", p.g, p.g, false, for_gpu));
  TPF_RETURN_IF_ERROR(check_rows(c, "o", p.o, p.g, false, for_gpu));
  if (!backward || p.y.present()) TPF_RETURN_IF_ERROR(check_rows(c, "y", p.y, p.g, true, for_gpu));
  if (!backward) return Status::Ok();
  TPF_RETURN_IF_ERROR(check_rows(c, "dy", p.dy, p.g, false, for_gpu));
  TPF_RETURN_IF_ERROR(check_rows(c, "dg", p.dg, p.g, true, for_gpu));
  return check_rows(c, "d_o", p.d_o, p.g, true, for_gpu);
}

Status sigmoid_gate_forward(const SigmoidGateParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "sigmoid_gate";
  TPF_RETURN_IF_ERROR(validate_sigmoid_gate(p, false, true));
  TPF_RETURN_IF_ERROR(
      detail::check_device_pointers(kOp, stream, {{"g", p.g.data}, {"o", p.o.data}, {"y", p.y.data}}));
  return detail::cuda_status(kOp, act::forward(shape_of(p), rows(p.g), rows(p.o), rows(p.y), stream));
}

Status sigmoid_gate_backward(const SigmoidGateParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "sigmoid_gate_backward";
  TPF_RETURN_IF_ERROR(validate_sigmoid_gate(p, true, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(kOp, stream,
                                                    {{"g", p.g.data},
                                                     {"o", p.o.data},
                                                     {"y", p.y.data},
                                                     {"dy", p.dy.data},
                                                     {"dg", p.dg.data},
                                                     {"d_o", p.d_o.data}}));
  return detail::cuda_status(kOp, act::backward(shape_of(p), rows(p.g), rows(p.o), rows(p.dy), rows(p.dg),
                                                rows(p.d_o), rows(p.y), stream));
}

}  // namespace tpf
