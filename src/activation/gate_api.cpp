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

// The backward's delta and out_residual (gate.h): delta [B, I, J, H] over the R rows and the
// heads of W, fp32 (fp64 too for the reference); on the GPU a 16-bit g and D = W / H with D / 8
// a power of two up to 32 (a head's lanes in one warp, summed as the attention backward does).
Status check_delta(const Checker& c, const SigmoidGateParams& p, bool for_gpu) {
  if (!p.delta.present())
    return p.out_residual.present() ? c.fail("out_residual", "is only read with delta; pass delta too")
                                    : Status::Ok();
  TPF_RETURN_IF_ERROR(c.shape("delta", p.delta, {{"B", -1}, {"I", -1}, {"J", -1}, {"H", -1}}));
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64("delta", p.delta, {DType::kFP32}, !for_gpu));
  TPF_RETURN_IF_ERROR(c.writable("delta", p.delta));
  const int64_t R = p.g.shape[0], W = p.g.shape[1], H = p.delta.shape[3];
  if (p.delta.shape[0] * p.delta.shape[1] * p.delta.shape[2] != R || W % H != 0)
    return c.fail("delta", "shape " + detail::shape_string(p.delta) + " does not split g's " + std::to_string(R) +
                               " rows as B I J and its width W=" + std::to_string(W) + " as H heads");
  if (p.out_residual.present()) TPF_RETURN_IF_ERROR(check_rows(c, "out_residual", p.out_residual, p.g, false, for_gpu));
  if (!for_gpu) return Status::Ok();
  const int64_t lanes = W / H / 8;
  if (p.g.dtype == DType::kFP32 || W / H % 8 != 0 || lanes > 32 || (lanes & (lanes - 1)) != 0)
    return c.fail("delta", "head dim D=" + std::to_string(W / H) + " with g in " + dtype_name(p.g.dtype) +
                               " is not built for the GPU; supported: 16-bit g, D in 8, 16, 32, 64, 128, 256",
                  StatusCode::kUnsupported);
  return Status::Ok();
}

act::Rows rows(const TensorView& t) { return {t.data, t.stride[0]}; }

act::HeadDots head_dots(const SigmoidGateParams& p) {
  if (!p.delta.present()) return {};
  const TensorView& d = p.delta;
  return {static_cast<float*>(d.data), d.shape[1], d.shape[2], p.g.shape[1] / d.shape[3],
          {d.stride[0], d.stride[1], d.stride[2], d.stride[3]},
          p.out_residual.present() ? rows(p.out_residual) : act::Rows{nullptr, 0}};
}

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
  if (!backward)
    return p.delta.present() || p.out_residual.present()
               ? c.fail(p.delta.present() ? "delta" : "out_residual", "is the backward's; the forward takes none")
               : Status::Ok();
  TPF_RETURN_IF_ERROR(check_rows(c, "dy", p.dy, p.g, false, for_gpu));
  TPF_RETURN_IF_ERROR(check_rows(c, "dg", p.dg, p.g, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_rows(c, "d_o", p.d_o, p.g, true, for_gpu));
  return check_delta(c, p, for_gpu);
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
                                                     {"d_o", p.d_o.data},
                                                     {"out_residual", p.out_residual.data},
                                                     {"delta", p.delta.data}}));
  return detail::cuda_status(kOp, act::backward(shape_of(p), rows(p.g), rows(p.o), rows(p.dy), rows(p.dg),
                                                rows(p.d_o), rows(p.y), head_dots(p), stream));
}

}  // namespace tpf
