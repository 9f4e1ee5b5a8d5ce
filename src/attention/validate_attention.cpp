// Argument validation of triangle attention, shared by the CUDA path and the reference.
#include <cmath>

#include "common/validate.h"
#include "turbopairformer/attention.h"

namespace tpf {
namespace {

using detail::Checker;
using detail::Dim;

struct Shape {
  int64_t B, S, H, N, D;
};

Status check_scale(const Checker& c, const std::optional<double>& scale) {
  if (scale && !(std::isfinite(*scale) && *scale > 0.0))
    return c.fail("scale", "must be a finite positive number");
  return Status::Ok();
}

// A [B,S,H,N,D] tensor of the activation dtype.
Status check_bshnd(const Checker& c, const char* arg, const TensorView& t, const Shape& s,
                   DType act, bool for_gpu, bool output = false) {
  TPF_RETURN_IF_ERROR(
      c.shape(arg, t, {{"B", s.B}, {"S", s.S}, {"H", s.H}, {"N", s.N}, {"D", s.D}}));
  if (output) TPF_RETURN_IF_ERROR(c.writable(arg, t));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, {act}));
  TPF_RETURN_IF_ERROR(c.unit_last_stride(arg, t));
  if (for_gpu) TPF_RETURN_IF_ERROR(c.aligned(arg, t, 16));
  return Status::Ok();
}

// q, k, v, bias, mask: the inputs common to forward and backward. Fills `s`.
Status check_inputs(const Checker& c, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& bias, const TensorView& mask,
                    bool for_gpu, Shape* s) {
  TPF_RETURN_IF_ERROR(c.shape("q", q, {{"B", -1}, {"S", -1}, {"H", -1}, {"N", -1}, {"D", -1}}));
  *s = {q.shape[0], q.shape[1], q.shape[2], q.shape[3], q.shape[4]};
  if (for_gpu) {
    TPF_RETURN_IF_ERROR(c.dtype("q", q, {DType::kBF16, DType::kFP16}));
    if (!attention_head_dim_supported(s->D)) {
      return c.fail("q", "head dim D=" + std::to_string(s->D) +
                             " is not built for the GPU; supported: 16, 32, 64, 128 (zero-pad D "
                             "up to the next one)");
    }
  } else {
    TPF_RETURN_IF_ERROR(
        c.dtype("q", q, {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP64}));
  }
  TPF_RETURN_IF_ERROR(check_bshnd(c, "q", q, *s, q.dtype, for_gpu));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "k", k, *s, q.dtype, for_gpu));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "v", v, *s, q.dtype, for_gpu));

  TPF_RETURN_IF_ERROR(
      c.shape("bias", bias, {{"B", s->B}, {"1", 1}, {"H", s->H}, {"N", s->N}, {"N", s->N}}));
  if (for_gpu) {
    TPF_RETURN_IF_ERROR(c.dtype("bias", bias, {q.dtype, DType::kFP32}));
  } else {
    TPF_RETURN_IF_ERROR(
        c.dtype("bias", bias, {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP64}));
  }
  if (mask.present()) {
    TPF_RETURN_IF_ERROR(
        c.shape("mask", mask, {{"B", s->B}, {"S", s->S}, {"1", 1}, {"1", 1}, {"N", s->N}}));
    TPF_RETURN_IF_ERROR(c.dtype("mask", mask, {DType::kBool}));
  }
  return Status::Ok();
}

// A contiguous fp32 [B,S,H,N] row statistic (lse written by the forward, delta an input).
Status check_bshn(const Checker& c, const char* arg, const TensorView& t, const Shape& s, bool output) {
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"B", s.B}, {"S", s.S}, {"H", s.H}, {"N", s.N}}));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, {DType::kFP32}));
  if (output) TPF_RETURN_IF_ERROR(c.writable(arg, t));
  return c.contiguous(arg, t);
}

}  // namespace

bool attention_head_dim_supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

Status validate_attention_forward(const AttentionForwardParams& p, bool for_gpu) {
  const Checker c{"attention_forward"};
  Shape s;
  TPF_RETURN_IF_ERROR(check_inputs(c, p.q, p.k, p.v, p.bias, p.mask, for_gpu, &s));
  TPF_RETURN_IF_ERROR(check_scale(c, p.scale));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "out", p.out, s, p.q.dtype, for_gpu, true));
  if (p.compensate) {
    if (!p.out_residual.present())
      return c.fail("out_residual", "is required when compensate is true (pass compensate=false "
                                    "to run without it)");
    TPF_RETURN_IF_ERROR(
        check_bshnd(c, "out_residual", p.out_residual, s, p.q.dtype, for_gpu, true));
  }
  if (for_gpu || p.lse.present()) TPF_RETURN_IF_ERROR(check_bshn(c, "lse", p.lse, s, true));
  return Status::Ok();
}

Status validate_attention_backward(const AttentionBackwardParams& p, bool for_gpu) {
  const Checker c{"attention_backward"};
  Shape s;
  TPF_RETURN_IF_ERROR(check_inputs(c, p.q, p.k, p.v, p.bias, p.mask, for_gpu, &s));
  TPF_RETURN_IF_ERROR(check_scale(c, p.scale));
  // The reference may recompute the exact output when none is given; the GPU needs it.
  if (for_gpu || p.out.present()) TPF_RETURN_IF_ERROR(check_bshnd(c, "out", p.out, s, p.q.dtype, for_gpu));
  if (p.compensate && p.out.present()) {
    if (!p.out_residual.present())
      return c.fail("out_residual", "is required when compensate is true (pass compensate=false "
                                    "to run without it)");
    TPF_RETURN_IF_ERROR(check_bshnd(c, "out_residual", p.out_residual, s, p.q.dtype, for_gpu));
  }
  if (for_gpu) TPF_RETURN_IF_ERROR(check_bshn(c, "lse", p.lse, s, true));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "dout", p.dout, s, p.q.dtype, for_gpu));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "dq", p.dq, s, p.q.dtype, for_gpu, true));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "dk", p.dk, s, p.q.dtype, for_gpu, true));
  TPF_RETURN_IF_ERROR(check_bshnd(c, "dv", p.dv, s, p.q.dtype, for_gpu, true));
  if (p.dbias.present()) {
    TPF_RETURN_IF_ERROR(
        c.shape("dbias", p.dbias, {{"B", s.B}, {"1", 1}, {"H", s.H}, {"N", s.N}, {"N", s.N}}));
    TPF_RETURN_IF_ERROR(c.dtype("dbias", p.dbias, {p.bias.dtype}));
    TPF_RETURN_IF_ERROR(c.writable("dbias", p.dbias));
  }
  return p.delta.present() ? check_bshn(c, "delta", p.delta, s, false) : Status::Ok();
}

}  // namespace tpf
