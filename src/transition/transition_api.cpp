// The fused transition, forward and the backward's middle: validation and the CUDA entry points.
#include <string>

#include "common/cuda_check.h"
#include "common/validate.h"
#include "transition/kernels.h"
#include "turbopairformer/transition.h"

namespace tpf {
namespace {

using detail::Checker;

int64_t rows_of(const TensorView& x) { return x.rank ? x.numel() / x.shape[x.rank - 1] : 0; }

// t holds one value a row of x (x's leading dims, or any shape of that many elements), fp32.
Status check_per_row(const Checker& c, const char* arg, const TensorView& t, const TensorView& x, bool ref) {
  TPF_RETURN_IF_ERROR(c.present(arg, t));
  if (t.numel() != rows_of(x))
    return c.fail(arg, "must hold one value per row of x (" + std::to_string(rows_of(x)) + "), got shape " +
                           detail::shape_string(t));
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64(arg, t, {DType::kFP32}, ref));
  return c.contiguous(arg, t);
}

// W_ab [2H, C] and W_o [C, H], bf16 contiguous, H a multiple of kChunk.
Status check_weights(const Checker& c, const TensorView& w_ab, const TensorView& w_o, int64_t C, bool ref) {
  TPF_RETURN_IF_ERROR(c.shape("w_ab", w_ab, {{"2H", -1}, {"C", C}}));
  const int64_t H = w_ab.shape[0] / 2;
  if (w_ab.shape[0] % 2 || H % transition::kChunk || H > (int64_t{1} << 20))
    return c.fail("w_ab", "rows 2H=" + std::to_string(w_ab.shape[0]) + " are not built; supported: H a multiple of 64",
                  StatusCode::kUnsupported);
  TPF_RETURN_IF_ERROR(c.shape("w_o", w_o, {{"C", C}, {"H", H}}));
  for (const auto& [name, t] : {std::pair{"w_ab", &w_ab}, std::pair{"w_o", &w_o}}) {
    TPF_RETURN_IF_ERROR(c.dtype_or_fp64(name, *t, {DType::kBF16}, ref));
    TPF_RETURN_IF_ERROR(c.contiguous(name, *t));
    TPF_RETURN_IF_ERROR(c.aligned(name, *t, 16));
  }
  return Status::Ok();
}

// Rows of C = 128 channels, at most 2^31 - 128 of them (the tensor maps' 32-bit row index).
Status check_rows(const Checker& c, const char* arg, const TensorView& x) {
  TPF_RETURN_IF_ERROR(c.present(arg, x));
  if (x.rank < 1) return c.fail(arg, "must have at least one dimension [..., C]");
  const int64_t C = x.shape[x.rank - 1];
  if (C != transition::kC)
    return c.fail(arg, "channels C=" + std::to_string(C) + " are not built; supported: C = 128 (c_z)",
                  StatusCode::kUnsupported);
  if (rows_of(x) > (int64_t{1} << 31) - 128)
    return c.fail(arg, "more than 2^31 - 128 rows: the tensor maps index rows in 32 bits", StatusCode::kUnsupported);
  return Status::Ok();
}

// t: x's leading dims with a last dimension of `last`, the given dtype, contiguous, 16-byte
// aligned; when `out`, also writable.
Status check_rows_like(const Checker& c, const char* arg, const TensorView& t, const TensorView& x, int64_t last,
                       DType dtype, bool ref, bool out) {
  TPF_RETURN_IF_ERROR(c.present(arg, t));
  bool same = t.rank == x.rank;
  for (int i = 0; same && i < x.rank; ++i) same = t.shape[i] == (i + 1 == x.rank ? last : x.shape[i]);
  if (!same)
    return c.fail(arg, "must be x's shape " + detail::shape_string(x) + " with last dimension " + std::to_string(last) +
                           ", got " + detail::shape_string(t));
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64(arg, t, {dtype}, ref));
  TPF_RETURN_IF_ERROR(c.contiguous(arg, t));
  if (out) TPF_RETURN_IF_ERROR(c.writable(arg, t));
  return c.aligned(arg, t, 16);
}

}  // namespace

Status validate_transition(const TransitionParams& p, bool for_gpu) {
  const Checker c{"transition"};
  const bool ref = !for_gpu;  // the CPU reference also takes FP64 for every tensor
  TPF_RETURN_IF_ERROR(check_rows(c, "x", p.x));
  const int64_t C = transition::kC;
  TPF_RETURN_IF_ERROR(c.dtype_or_fp64("x", p.x, {DType::kFP32, DType::kBF16}, ref));
  TPF_RETURN_IF_ERROR(c.contiguous("x", p.x));
  TPF_RETURN_IF_ERROR(c.aligned("x", p.x, 16));
  for (const auto& [name, t] : {std::pair{"ln_w", &p.ln_w}, std::pair{"ln_b", &p.ln_b}})
    if (t->present()) {
      TPF_RETURN_IF_ERROR(c.shape(name, *t, {{"C", C}}));
      TPF_RETURN_IF_ERROR(c.dtype_or_fp64(name, *t, {DType::kFP32}, ref));
      TPF_RETURN_IF_ERROR(c.contiguous(name, *t));
    }
  TPF_RETURN_IF_ERROR(check_weights(c, p.w_ab, p.w_o, C, ref));
  if (p.scale.present()) {
    if (!p.residual) return c.fail("scale", "applies to the residual update only (residual = true)");
    TPF_RETURN_IF_ERROR(check_per_row(c, "scale", p.scale, p.x, ref));
  }
  const DType out_dtype = p.residual ? p.x.dtype : DType::kBF16;
  TPF_RETURN_IF_ERROR(check_rows_like(c, "out", p.out, p.x, C, out_dtype, ref, true));
  if (p.xhat.present()) TPF_RETURN_IF_ERROR(check_rows_like(c, "xhat", p.xhat, p.x, C, DType::kBF16, ref, true));
  for (const auto& [name, t] : {std::pair{"mean", &p.mean}, std::pair{"rstd", &p.rstd}})
    if (t->present()) TPF_RETURN_IF_ERROR(check_per_row(c, name, *t, p.x, ref));
  return Status::Ok();
}

Status transition_forward(const TransitionParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "transition";
  TPF_RETURN_IF_ERROR(validate_transition(p, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"x", p.x.data}, {"ln_w", p.ln_w.data}, {"ln_b", p.ln_b.data}, {"w_ab", p.w_ab.data},
                    {"w_o", p.w_o.data}, {"scale", p.scale.data}, {"out", p.out.data}, {"xhat", p.xhat.data},
                    {"mean", p.mean.data}, {"rstd", p.rstd.data}}));
  TPF_RETURN_IF_ERROR(detail::require_sm90(kOp));
  const transition::FwdArgs a{rows_of(p.x),
                              static_cast<int>(p.w_ab.shape[0] / 2),
                              p.x.data,
                              p.x.dtype,
                              static_cast<const float*>(p.ln_w.data),
                              static_cast<const float*>(p.ln_b.data),
                              p.eps,
                              static_cast<const __nv_bfloat16*>(p.w_ab.data),
                              static_cast<const __nv_bfloat16*>(p.w_o.data),
                              static_cast<const float*>(p.scale.data),
                              p.residual,
                              p.out.data,
                              static_cast<__nv_bfloat16*>(p.xhat.data),
                              static_cast<float*>(p.mean.data),
                              static_cast<float*>(p.rstd.data)};
  return detail::cuda_status(kOp, transition::forward(a, stream));
}

Status validate_transition_backward(const TransitionBackwardParams& p, bool for_gpu) {
  const Checker c{"transition_backward"};
  const bool ref = !for_gpu;
  TPF_RETURN_IF_ERROR(check_rows(c, "xhat", p.xhat));
  constexpr int64_t C = transition::kC;
  constexpr DType kB = DType::kBF16;
  TPF_RETURN_IF_ERROR(check_rows_like(c, "xhat", p.xhat, p.xhat, C, kB, ref, false));
  TPF_RETURN_IF_ERROR(check_weights(c, p.w_ab, p.w_o, C, ref));
  const int64_t H = p.w_ab.shape[0] / 2;
  TPF_RETURN_IF_ERROR(check_rows_like(c, "g", p.g, p.xhat, C, kB, ref, false));
  TPF_RETURN_IF_ERROR(check_rows_like(c, "h", p.h, p.xhat, H, kB, ref, true));
  TPF_RETURN_IF_ERROR(check_rows_like(c, "dab", p.dab, p.xhat, 2 * H, kB, ref, true));
  return check_rows_like(c, "dxhat", p.dxhat, p.xhat, C, kB, ref, true);
}

Status transition_backward(const TransitionBackwardParams& p, cudaStream_t stream) {
  constexpr const char* kOp = "transition_backward";
  TPF_RETURN_IF_ERROR(validate_transition_backward(p, true));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      kOp, stream, {{"xhat", p.xhat.data}, {"g", p.g.data}, {"w_ab", p.w_ab.data}, {"w_o", p.w_o.data},
                    {"h", p.h.data}, {"dab", p.dab.data}, {"dxhat", p.dxhat.data}}));
  TPF_RETURN_IF_ERROR(detail::require_sm90(kOp));
  using B = __nv_bfloat16;
  const transition::BwdArgs a{rows_of(p.xhat), static_cast<int>(p.w_ab.shape[0] / 2),
                              static_cast<const B*>(p.xhat.data), static_cast<const B*>(p.g.data),
                              static_cast<const B*>(p.w_ab.data), static_cast<const B*>(p.w_o.data),
                              static_cast<B*>(p.h.data), static_cast<B*>(p.dab.data), static_cast<B*>(p.dxhat.data)};
  return detail::cuda_status(kOp, transition::backward(a, stream));
}

}  // namespace tpf
