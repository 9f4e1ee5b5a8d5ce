// Argument validation of the stand-alone LayerNorm.
#include <string>

#include "common/validate.h"
#include "turbopairformer/layer_norm.h"

namespace tpf {
namespace {

using detail::Checker;

const std::initializer_list<DType> kFloat = {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP64};
const std::initializer_list<DType> kGpuFloat = {DType::kBF16, DType::kFP16, DType::kFP32};

// The (x, y) dtype pairs the CUDA path is built for.
// A tensor of x's shape: same rank and sizes, contiguous.
Status check_like_x(const Checker& c, const char* arg, const TensorView& t, const TensorView& x) {
  TPF_RETURN_IF_ERROR(c.present(arg, t));
  bool same = t.rank == x.rank;
  for (int i = 0; same && i < x.rank; ++i) same = t.shape[i] == x.shape[i];
  if (!same) return c.fail(arg, "must have x's shape " + detail::shape_string(x) + ", got " + detail::shape_string(t));
  return c.contiguous(arg, t);
}

Status check_param(const Checker& c, const char* arg, const TensorView& t, int64_t W, bool for_gpu) {
  if (!t.present()) return Status::Ok();
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"W", W}}));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, for_gpu ? kGpuFloat : kFloat));
  return c.unit_last_stride(arg, t);
}

Status check_stat(const Checker& c, const char* arg, const TensorView& t, int64_t rows, bool required) {
  if (!t.present()) return required ? c.present(arg, t) : Status::Ok();
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"rows", rows}}));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, {DType::kFP32}));
  TPF_RETURN_IF_ERROR(c.contiguous(arg, t));
  return c.writable(arg, t);
}

Status check_inputs(const Checker& c, const LayerNormForwardParams& p, bool for_gpu, bool need_stats) {
  TPF_RETURN_IF_ERROR(c.present("x", p.x));
  if (p.x.rank < 1) return c.fail("x", "must have at least one dimension [..., W]");
  TPF_RETURN_IF_ERROR(c.dtype("x", p.x, for_gpu ? kGpuFloat : kFloat));
  TPF_RETURN_IF_ERROR(c.contiguous("x", p.x));
  const int64_t W = p.x.shape[p.x.rank - 1];
  if (W < 1) return c.fail("x", "last dimension W must be at least 1, got " + detail::shape_string(p.x));
  if (for_gpu && (W % 32 != 0 || W > 256))
    return c.fail("x", "last dimension W=" + std::to_string(W) +
                           " is not built for the GPU; supported: multiples of 32 up to 256",
                  StatusCode::kUnsupported);
  TPF_RETURN_IF_ERROR(check_param(c, "weight", p.weight, W, for_gpu));
  TPF_RETURN_IF_ERROR(check_param(c, "bias", p.bias, W, for_gpu));
  if (!(p.eps > 0.0)) return c.fail("eps", "must be positive");
  const int64_t rows = p.x.numel() / W;
  TPF_RETURN_IF_ERROR(check_stat(c, "mean", p.mean, rows, need_stats));
  TPF_RETURN_IF_ERROR(check_stat(c, "rstd", p.rstd, rows, need_stats));
  if (p.mean.present() != p.rstd.present()) return c.fail("rstd", "mean and rstd are given together or not at all");
  return Status::Ok();
}

Status check_grad(const Checker& c, const char* arg, const TensorView& g, const TensorView& w) {
  if (!g.present()) return Status::Ok();
  if (!w.present()) return c.fail(arg, "is given but the matching parameter is absent");
  TPF_RETURN_IF_ERROR(c.shape(arg, g, {{"W", w.shape[0]}}));
  TPF_RETURN_IF_ERROR(c.dtype(arg, g, {w.dtype}));
  TPF_RETURN_IF_ERROR(c.contiguous(arg, g));
  return c.writable(arg, g);
}

}  // namespace

Status validate_layer_norm_forward(const LayerNormForwardParams& p, bool for_gpu) {
  const Checker c{"layer_norm"};
  TPF_RETURN_IF_ERROR(check_inputs(c, p, for_gpu, false));
  TPF_RETURN_IF_ERROR(check_like_x(c, "y", p.y, p.x));
  TPF_RETURN_IF_ERROR(c.dtype("y", p.y, for_gpu ? kGpuFloat : kFloat));
  if (for_gpu && !detail::mixed_pair(p.x.dtype, p.y.dtype))
    return c.fail("y", std::string("dtype ") + dtype_name(p.y.dtype) + " from x of dtype " + dtype_name(p.x.dtype) +
                           " is not built for the GPU; supported (x, y): (fp32, fp32|bf16|fp16), (bf16, bf16), "
                           "(fp16, fp16)",
                  StatusCode::kInvalidType);
  return c.writable("y", p.y);
}

Status validate_layer_norm_backward(const LayerNormBackwardParams& p, bool for_gpu) {
  const Checker c{"layer_norm_backward"};
  TPF_RETURN_IF_ERROR(check_inputs(c, p.fwd, for_gpu, true));
  TPF_RETURN_IF_ERROR(check_like_x(c, "dy", p.dy, p.fwd.x));
  TPF_RETURN_IF_ERROR(c.dtype("dy", p.dy, for_gpu ? kGpuFloat : kFloat));
  if (for_gpu && !detail::mixed_pair(p.fwd.x.dtype, p.dy.dtype))
    return c.fail("dy", std::string("dtype ") + dtype_name(p.dy.dtype) + " for x of dtype " +
                            dtype_name(p.fwd.x.dtype) + " is not built for the GPU; supported (x, dy): (fp32, "
                            "fp32|bf16|fp16), (bf16, bf16), (fp16, fp16)",
                  StatusCode::kInvalidType);
  TPF_RETURN_IF_ERROR(check_like_x(c, "dx", p.dx, p.fwd.x));
  TPF_RETURN_IF_ERROR(c.dtype("dx", p.dx, {p.fwd.x.dtype}));
  TPF_RETURN_IF_ERROR(c.writable("dx", p.dx));
  if (p.dx_in.present()) {
    TPF_RETURN_IF_ERROR(check_like_x(c, "dx_in", p.dx_in, p.fwd.x));
    TPF_RETURN_IF_ERROR(c.dtype("dx_in", p.dx_in, {p.fwd.x.dtype}));
  }
  TPF_RETURN_IF_ERROR(check_grad(c, "dweight", p.dweight, p.fwd.weight));
  return check_grad(c, "dbias", p.dbias, p.fwd.bias);
}

}  // namespace tpf
