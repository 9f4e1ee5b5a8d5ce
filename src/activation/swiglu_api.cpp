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

}  // namespace

Status validate_swiglu(const SwigluParams& p, bool backward, bool for_gpu) {
  const Checker c{backward ? "swiglu_backward" : "swiglu"};
  TPF_RETURN_IF_ERROR(c.present("x", p.x));
  if (p.x.rank < 1) return c.fail("x", "must have at least one dimension [..., 2H]");
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64("x", p.x, {DType::kBF16, DType::kFP16, DType::kFP32}, !for_gpu));
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
  if (!backward) return Status::Ok();
  TPF_RETURN_IF_ERROR(check_like(c, "dy", p.dy, p.x, W / 2));
  TPF_RETURN_IF_ERROR(check_like(c, "dx", p.dx, p.x, W));
  TPF_RETURN_IF_ERROR(c.writable("dx", p.dx));
  if (for_gpu) {
    TPF_RETURN_IF_ERROR(c.aligned("dy", p.dy, 16));
    TPF_RETURN_IF_ERROR(c.aligned("dx", p.dx, 16));
  }
  return Status::Ok();
}

Status swiglu_forward(const SwigluParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu";
  TPF_RETURN_IF_ERROR(validate_swiglu(p, false, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(kOp, stream, {{"x", p.x.data}, {"y", p.y.data}}));
  const act::Shape s = shape_of(p);
  return detail::cuda_status(
      kOp, act::forward(s, columns(p.x, 0, 2 * s.W), columns(p.x, s.W, 2 * s.W), columns(p.y, 0, s.W), stream));
}

Status swiglu_backward(const SwigluParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu_backward";
  TPF_RETURN_IF_ERROR(validate_swiglu(p, true, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"x", p.x.data}, {"y", p.y.data}, {"dy", p.dy.data}, {"dx", p.dx.data}}));
  const act::Shape s = shape_of(p);
  const int64_t H = s.W;
  return detail::cuda_status(kOp, act::backward(s, columns(p.x, 0, 2 * H), columns(p.x, H, 2 * H), columns(p.dy, 0, H),
                                                columns(p.dx, 0, 2 * H), columns(p.dx, H, 2 * H),
                                                columns(p.y, 0, H), act::HeadDots{}, stream));
}

}  // namespace tpf
