// SwiGLU: validation and CUDA entry points.
#include <string>

#include "activation/kernels.h"
#include "common/cuda_check.h"
#include "common/validate.h"
#include "turbopairformer/swiglu.h"

namespace tpf {
namespace {

using detail::Checker;

// t has x's leading dims and a last dim of `last`, x's dtype, contiguous.
Status check_like(const Checker& c, const char* arg, const TensorView& t, const TensorView& x, int64_t last) {
  TPF_RETURN_IF_ERROR(c.present(arg, t));
  bool same = t.rank == x.rank;
  for (int i = 0; same && i < x.rank; ++i) same = t.shape[i] == (i + 1 == x.rank ? last : x.shape[i]);
  if (!same)
    return c.fail(arg, "must be x's shape " + detail::shape_string(x) + " with last dimension " +
                           std::to_string(last) + ", got " + detail::shape_string(t));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, {x.dtype}));
  return c.contiguous(arg, t);
}

act::Shape shape_of(const SwigluParams& p) {
  const int64_t H = p.x.shape[p.x.rank - 1] / 2;
  return {act::Gate::kSilu, H ? p.x.numel() / (2 * H) : 0, H, p.x.dtype};
}

// Columns [col, col + H) of the contiguous rows of t, whose width is `width`.
act::Rows columns(const TensorView& t, int64_t col, int64_t width) {
  return {static_cast<const char*>(t.data) + col * dtype_size(t.dtype), width};
}

// The projection operands: `in` ([..., C], x's leading dims) and `w` ([rows, C] with
// transposed false, [C, cols] with true), x's dtype, contiguous; GPU only.
Status check_projection(const Checker& c, const SwigluParams& p, const char* in_arg, const TensorView& in,
                        const char* w_arg, const TensorView& w, bool transposed, bool for_gpu) {
  TPF_RETURN_IF_ERROR(c.present(in_arg, in));
  TPF_RETURN_IF_ERROR(c.present(w_arg, w));
  const int64_t H = p.x.shape[p.x.rank - 1] / 2, C = in.rank ? in.shape[in.rank - 1] : 0;
  TPF_RETURN_IF_ERROR(check_like(c, in_arg, in, p.x, C));
  const int64_t want0 = transposed ? C : 2 * H, want1 = transposed ? H : C;
  TPF_RETURN_IF_ERROR(c.dtype(w_arg, w, {p.x.dtype}));
  if (w.rank != 2 || w.shape[0] != want0 || w.shape[1] != want1)
    return c.fail(w_arg, "must be [" + std::to_string(want0) + ", " + std::to_string(want1) + "], got " +
                             detail::shape_string(w));
  TPF_RETURN_IF_ERROR(c.contiguous(w_arg, w));
  if (H % 64 != 0)
    return c.fail("x", "half width H=" + std::to_string(H) + " must be a multiple of 64 with " + w_arg +
                           " (its rows come in 64-row blocks)");
  if (!for_gpu) return Status::Ok();
  TPF_RETURN_IF_ERROR(c.dtype("x", p.x, {DType::kBF16, DType::kFP16}));
  if (C % 8 != 0)
    return c.fail(in_arg, "width C=" + std::to_string(C) + " is not built for the fused projection; supported: "
                  "multiples of 8", StatusCode::kUnsupported);
  TPF_RETURN_IF_ERROR(c.aligned(in_arg, in, 16));
  return c.aligned(w_arg, w, 16);
}

act::ProjectShape project_shape(const SwigluParams& p, const TensorView& in) {
  const int64_t H = p.x.shape[p.x.rank - 1] / 2, C = in.shape[in.rank - 1];
  return {H ? p.x.numel() / (2 * H) : 0, C, H, p.x.dtype};
}

}  // namespace

Status validate_swiglu(const SwigluParams& p, bool backward, bool for_gpu) {
  const Checker c{backward ? "swiglu_backward" : "swiglu"};
  TPF_RETURN_IF_ERROR(c.present("x", p.x));
  if (p.x.rank < 1) return c.fail("x", "must have at least one dimension [..., 2H]");
  if (for_gpu) TPF_RETURN_IF_ERROR(c.dtype("x", p.x, {DType::kBF16, DType::kFP16, DType::kFP32}));
  else TPF_RETURN_IF_ERROR(c.dtype("x", p.x, {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP64}));
  TPF_RETURN_IF_ERROR(c.contiguous("x", p.x));
  const int64_t W = p.x.shape[p.x.rank - 1];
  if (W % 2 != 0) return c.fail("x", "last dimension must be even ([a | b], 2H), got " + std::to_string(W));
  if (for_gpu && (W / 2) % 8 != 0)
    return c.fail("x", "half width H=" + std::to_string(W / 2) + " is not built for the GPU; supported: multiples of 8",
                  StatusCode::kUnsupported);
  if (for_gpu) TPF_RETURN_IF_ERROR(c.aligned("x", p.x, 16));
  if (!backward || p.y.present()) {
    TPF_RETURN_IF_ERROR(check_like(c, "y", p.y, p.x, W / 2));
    TPF_RETURN_IF_ERROR(c.writable("y", p.y));
    if (for_gpu) TPF_RETURN_IF_ERROR(c.aligned("y", p.y, 16));
  }
  if (!backward) {
    if (p.w_up.present() && !p.u.present()) return c.fail("u", "is required with w_up");
    return p.u.present() ? check_projection(c, p, "u", p.u, "w_up", p.w_up, false, for_gpu) : Status::Ok();
  }
  if (p.g.present() || p.w_down.present()) {
    if (p.dy.present()) return c.fail("dy", "must be absent when g and w_down give it");
    TPF_RETURN_IF_ERROR(check_projection(c, p, "g", p.g, "w_down", p.w_down, true, for_gpu));
  } else {
    TPF_RETURN_IF_ERROR(check_like(c, "dy", p.dy, p.x, W / 2));
  }
  TPF_RETURN_IF_ERROR(check_like(c, "dx", p.dx, p.x, W));
  TPF_RETURN_IF_ERROR(c.writable("dx", p.dx));
  if (for_gpu) {
    if (p.dy.present()) TPF_RETURN_IF_ERROR(c.aligned("dy", p.dy, 16));
    TPF_RETURN_IF_ERROR(c.aligned("dx", p.dx, 16));
  }
  return Status::Ok();
}

Status swiglu_forward(const SwigluParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu";
  TPF_RETURN_IF_ERROR(validate_swiglu(p, false, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"x", p.x.data}, {"y", p.y.data}, {"u", p.u.data}, {"w_up", p.w_up.data}}));
  if (p.u.present())
    return detail::cuda_status(
        kOp, act::project_forward(project_shape(p, p.u), p.u.data, p.w_up.data, p.x.data, p.y.data, stream));
  const act::Shape s = shape_of(p);
  return detail::cuda_status(
      kOp, act::forward(s, columns(p.x, 0, 2 * s.W), columns(p.x, s.W, 2 * s.W), columns(p.y, 0, s.W), stream));
}

Status swiglu_backward(const SwigluParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu_backward";
  TPF_RETURN_IF_ERROR(validate_swiglu(p, true, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream,
      {{"x", p.x.data}, {"y", p.y.data}, {"dy", p.dy.data}, {"dx", p.dx.data}, {"g", p.g.data},
       {"w_down", p.w_down.data}}));
  if (p.g.present())
    return detail::cuda_status(kOp, act::project_backward(project_shape(p, p.g), p.g.data, p.w_down.data, p.x.data,
                                                          p.dx.data, p.y.data, stream));
  const act::Shape s = shape_of(p);
  const int64_t H = s.W;
  return detail::cuda_status(kOp, act::backward(s, columns(p.x, 0, 2 * H), columns(p.x, H, 2 * H), columns(p.dy, 0, H),
                                                columns(p.dx, 0, 2 * H), columns(p.dx, H, 2 * H),
                                                columns(p.y, 0, H), stream));
}

}  // namespace tpf
