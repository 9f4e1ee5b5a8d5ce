// The fused gated output projection: validation and the CUDA entry point.
#include <string>

#include "common/cuda_check.h"
#include "common/validate.h"
#include "gated_linear/kernels.h"
#include "turbopairformer/gated_linear.h"

namespace tpf {
namespace {

using detail::Checker;
constexpr int64_t K = gated::kK, N = gated::kN;

// A pair tensor [B, I, J, N = 128], contiguous and 16-byte aligned; like `pair`'s shape when given.
Status check_pair(const Checker& c, const char* arg, const TensorView& t, const TensorView* pair,
                  std::initializer_list<DType> dtypes, bool ref, bool out) {
  TPF_RETURN_IF_ERROR(c.present(arg, t));
  if (t.rank != 4 || t.shape[3] != N)
    return c.fail(arg, "must be [B, I, J, N = 128], got shape " + detail::shape_string(t),
                  t.rank == 4 ? StatusCode::kUnsupported : StatusCode::kInvalidArgument);
  if (pair)
    TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"B", pair->shape[0]}, {"I", pair->shape[1]}, {"J", pair->shape[2]}, {"N", N}}));
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64(arg, t, dtypes, ref));
  TPF_RETURN_IF_ERROR(c.contiguous(arg, t));
  if (out) TPF_RETURN_IF_ERROR(c.writable(arg, t));
  return c.aligned(arg, t, 16);
}

// Rows [R, K = 128] bf16 with a unit last stride and 16-byte rows.
Status check_rows(const Checker& c, const char* arg, const TensorView& t, int64_t R, bool ref) {
  TPF_RETURN_IF_ERROR(c.present(arg, t));
  if (t.rank == 2 && t.shape[0] == R && t.shape[1] != K)
    return c.fail(arg, "width " + std::to_string(t.shape[1]) + " is not built; supported: K = 128 (heads x head dim)",
                  StatusCode::kUnsupported);
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"R = B I J", R}, {"K", K}}));
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64(arg, t, {DType::kBF16}, ref));
  TPF_RETURN_IF_ERROR(c.unit_last_stride(arg, t));
  return c.aligned(arg, t, 16);
}

Status check_weight(const Checker& c, const TensorView& w, bool ref) {
  TPF_RETURN_IF_ERROR(c.shape("w", w, {{"N", -1}, {"K", -1}}));
  if (w.shape[0] != N || w.shape[1] != K)
    return c.fail("w", "shape " + detail::shape_string(w) + " is not built; supported: [N = 128, K = 128]",
                  StatusCode::kUnsupported);
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64("w", w, {DType::kBF16}, ref));
  return c.contiguous("w", w);
}

gated::Shape shape_of(const TensorView& pair) { return {pair.shape[0], pair.shape[1], pair.shape[2], N}; }

}  // namespace

Status validate_gated_linear(const GatedLinearParams& p, bool for_gpu) {
  const Checker c{"gated_linear"};
  const bool ref = !for_gpu;
  const bool residual = p.x.present();
  if (residual) TPF_RETURN_IF_ERROR(check_pair(c, "x", p.x, nullptr, {DType::kFP32, DType::kBF16}, ref, false));
  const TensorView& pair = residual ? p.x : p.out;
  if (residual) TPF_RETURN_IF_ERROR(check_pair(c, "out", p.out, &pair, {p.x.dtype}, ref, true));
  else TPF_RETURN_IF_ERROR(check_pair(c, "out", p.out, nullptr, {DType::kBF16}, ref, true));
  const int64_t R = pair.shape[0] * pair.shape[1] * pair.shape[2];
  TPF_RETURN_IF_ERROR(check_rows(c, "g", p.g, R, ref));
  TPF_RETURN_IF_ERROR(check_rows(c, "o", p.o, R, ref));
  TPF_RETURN_IF_ERROR(check_weight(c, p.w, ref));
  if (p.bias.present()) {
    TPF_RETURN_IF_ERROR(c.shape("bias", p.bias, {{"N", N}}));
    TPF_RETURN_IF_ERROR(c.dtype_or_fp64("bias", p.bias, {DType::kBF16}, ref));
    TPF_RETURN_IF_ERROR(c.contiguous("bias", p.bias));
  }
  if (p.scale.present()) {
    if (!residual) return c.fail("scale", "applies to the residual update only (x given)");
    TPF_RETURN_IF_ERROR(c.scale("scale", p.scale, pair, {DType::kBF16, ref ? DType::kFP64 : DType::kBF16}, !ref));
  }
  return Status::Ok();
}

Status gated_linear_forward(const GatedLinearParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "gated_linear";
  TPF_RETURN_IF_ERROR(validate_gated_linear(p, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"g", p.g.data}, {"o", p.o.data}, {"w", p.w.data}, {"bias", p.bias.data}, {"x", p.x.data},
                    {"scale", p.scale.data}, {"out", p.out.data}}));
  TPF_RETURN_IF_ERROR(detail::require_sm90(kOp));
  using B = __nv_bfloat16;
  const gated::FwdArgs a{shape_of(p.out), static_cast<const B*>(p.g.data), p.g.stride[0],
                         static_cast<const B*>(p.o.data), p.o.stride[0], static_cast<const B*>(p.w.data),
                         static_cast<const B*>(p.bias.data), p.x.data, residual::scale_ref(p.scale), p.out.data, p.out.dtype};
  return detail::cuda_status(kOp, gated::forward(a, stream));
}

}  // namespace tpf
