// Argument validation of the triangle multiplicative update.
#include <string>

#include "common/validate.h"
#include "turbopairformer/trimul.h"

namespace tpf {
namespace {

using detail::Checker;

struct Shape {
  int64_t B, N, C, Ch;
};

bool gpu_width(int64_t c) { return c == 32 || c == 64 || c == 96 || c == 128 || c == 256; }

const std::initializer_list<DType> kFloat = {DType::kBF16, DType::kFP16, DType::kFP32,
                                             DType::kFP64};

Status check_weight(const Checker& c, const char* arg, const TensorView& t,
                    std::initializer_list<detail::Dim> dims, bool required, bool for_gpu) {
  if (!t.present()) return required ? c.present(arg, t) : Status::Ok();
  TPF_RETURN_IF_ERROR(c.shape(arg, t, dims));
  if (for_gpu) {
    TPF_RETURN_IF_ERROR(c.dtype(arg, t, {DType::kBF16, DType::kFP32}));
    TPF_RETURN_IF_ERROR(c.unit_last_stride(arg, t));
  } else {
    TPF_RETURN_IF_ERROR(c.dtype(arg, t, kFloat));
  }
  return Status::Ok();
}

Status check_weights(const Checker& c, const TrimulWeights& w, const Shape& s, bool for_gpu) {
  TPF_RETURN_IF_ERROR(check_weight(c, "norm_in_weight", w.norm_in_weight, {{"C", s.C}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "norm_in_bias", w.norm_in_bias, {{"C", s.C}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "p_in_weight", w.p_in_weight, {{"2*Ch", 2 * s.Ch}, {"C", s.C}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "p_in_bias", w.p_in_bias, {{"2*Ch", 2 * s.Ch}}, false, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "g_in_weight", w.g_in_weight, {{"2*Ch", 2 * s.Ch}, {"C", s.C}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "g_in_bias", w.g_in_bias, {{"2*Ch", 2 * s.Ch}}, false, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "norm_out_weight", w.norm_out_weight, {{"Ch", s.Ch}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "norm_out_bias", w.norm_out_bias, {{"Ch", s.Ch}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "p_out_weight", w.p_out_weight, {{"C", s.C}, {"Ch", s.Ch}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "p_out_bias", w.p_out_bias, {{"C", s.C}}, false, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "g_out_weight", w.g_out_weight, {{"C", s.C}, {"C", s.C}}, true, for_gpu));
  TPF_RETURN_IF_ERROR(check_weight(c, "g_out_bias", w.g_out_bias, {{"C", s.C}}, false, for_gpu));
  return Status::Ok();
}

// A gradient, where present, has its weight's shape and dtype and exists only for a weight.
Status check_grad(const Checker& c, const char* arg, const TensorView& g, const TensorView& w) {
  if (!g.present()) return Status::Ok();
  if (!w.present()) return c.fail(arg, "is given but the matching weight is absent");
  if (g.rank != w.rank) return c.fail(arg, "must have the weight's shape " + detail::shape_string(w) +
                                               ", got " + detail::shape_string(g));
  for (int i = 0; i < w.rank; ++i)
    if (g.shape[i] != w.shape[i])
      return c.fail(arg, "must have the weight's shape " + detail::shape_string(w) + ", got " +
                             detail::shape_string(g));
  TPF_RETURN_IF_ERROR(c.dtype(arg, g, {w.dtype}));
  return c.writable(arg, g);
}

// A [B,N,N,C] tensor of z's dtype (or fp32 where fp32_too).
Status check_output(const Checker& c, const char* arg, const TensorView& t,
                           const TensorView& z, bool fp32_too = false) {
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"B", z.shape[0]}, {"N", z.shape[1]}, {"N", z.shape[2]},
                                       {"C", z.shape[3]}}));
  TPF_RETURN_IF_ERROR(fp32_too ? c.dtype(arg, t, {z.dtype, DType::kFP32}) : c.dtype(arg, t, {z.dtype}));
  TPF_RETURN_IF_ERROR(c.unit_last_stride(arg, t));
  return Status::Ok();
}

// A [B,N,N,C] tensor like z, contiguous (16-byte aligned on the GPU): the residual update's
// tensors, which its epilogues address as whole rows.
Status check_pair_rows(const Checker& c, const char* arg, const TensorView& t, const TensorView& z,
                       std::initializer_list<DType> dtypes, bool for_gpu) {
  TPF_RETURN_IF_ERROR(c.shape(arg, t, {{"B", z.shape[0]}, {"N", z.shape[1]}, {"N", z.shape[2]}, {"C", z.shape[3]}}));
  TPF_RETURN_IF_ERROR(c.dtype(arg, t, dtypes));
  TPF_RETURN_IF_ERROR(c.contiguous(arg, t));
  return for_gpu ? c.aligned(arg, t, 16) : Status::Ok();
}

// The forward's residual update: residual like z (fp32 or z's dtype on the GPU), the scale only
// with it, out in residual's dtype.
Status check_residual(const Checker& c, const TrimulForwardParams& p, bool for_gpu) {
  if (!p.residual.present()) {
    if (p.scale.present()) return c.fail("scale", "applies to the residual update only (residual given)");
    return check_output(c, "out", p.out, p.z);
  }
  if (for_gpu) TPF_RETURN_IF_ERROR(check_pair_rows(c, "residual", p.residual, p.z, {DType::kFP32, p.z.dtype}, true));
  else TPF_RETURN_IF_ERROR(check_pair_rows(c, "residual", p.residual, p.z, kFloat, false));
  if (p.scale.present())
    TPF_RETURN_IF_ERROR(for_gpu ? c.scale("scale", p.scale, p.z, {DType::kBF16}, true)
                                : c.scale("scale", p.scale, p.z, kFloat, false));
  return check_pair_rows(c, "out", p.out, p.z, {p.residual.dtype}, for_gpu);
}

Status check_inputs(const TrimulForwardParams& p, bool for_gpu) {
  const Checker c{"triangle_multiplicative_update"};
  TPF_RETURN_IF_ERROR(c.shape("z", p.z, {{"B", -1}, {"N", -1}, {"N", -1}, {"C", -1}}));
  if (p.z.shape[1] != p.z.shape[2])
    return c.fail("z", "expected a square pair tensor [B,N,N,C], got " + detail::shape_string(p.z));
  if (for_gpu) TPF_RETURN_IF_ERROR(c.dtype("z", p.z, {DType::kBF16}));
  else TPF_RETURN_IF_ERROR(c.dtype("z", p.z, kFloat));
  TPF_RETURN_IF_ERROR(c.unit_last_stride("z", p.z));
  TPF_RETURN_IF_ERROR(c.shape("p_in_weight", p.w.p_in_weight, {{"2*Ch", -1}, {"C", p.z.shape[3]}}));
  if (p.w.p_in_weight.shape[0] % 2 != 0)
    return c.fail("p_in_weight", "first dimension must be even (2*Ch: [Wap; Wbp]), got " +
                                     std::to_string(p.w.p_in_weight.shape[0]));
  const Shape s{p.z.shape[0], p.z.shape[1], p.z.shape[3], p.w.p_in_weight.shape[0] / 2};
  if (for_gpu && !gpu_width(s.C))
    return c.fail("z", "channel count C=" + std::to_string(s.C) +
                           " is not built for the GPU; supported: 32, 64, 96, 128, 256");
  if (for_gpu && !gpu_width(s.Ch))
    return c.fail("p_in_weight", "hidden width Ch=" + std::to_string(s.Ch) +
                                     " is not built for the GPU; supported: 32, 64, 96, 128, 256");
  TPF_RETURN_IF_ERROR(check_weights(c, p.w, s, for_gpu));
  if (p.mask.present()) {
    TPF_RETURN_IF_ERROR(c.shape("mask", p.mask, {{"B", s.B}, {"N", s.N}, {"N", s.N}}));
    TPF_RETURN_IF_ERROR(c.dtype("mask", p.mask, {DType::kBool, DType::kBF16, DType::kFP16,
                                                 DType::kFP32, DType::kFP64}));
  }
  if (p.direction != TrimulDirection::kOutgoing && p.direction != TrimulDirection::kIncoming)
    return c.fail("direction", "must be outgoing or incoming");
  if (!(p.eps > 0.0)) return c.fail("eps", "must be positive");
  return Status::Ok();
}

}  // namespace

Status validate_trimul_forward(const TrimulForwardParams& p, bool for_gpu) {
  TPF_RETURN_IF_ERROR(check_inputs(p, for_gpu));
  const Checker c{"triangle_multiplicative_update"};
  TPF_RETURN_IF_ERROR(check_residual(c, p, for_gpu));
  return c.writable("out", p.out);
}

Status validate_trimul_backward(const TrimulBackwardParams& p, bool for_gpu) {
  TPF_RETURN_IF_ERROR(check_inputs(p.fwd, for_gpu));
  const Checker c{"triangle_multiplicative_update_backward"};
  TPF_RETURN_IF_ERROR(check_output(c, "dout", p.dout, p.fwd.z));
  TPF_RETURN_IF_ERROR(check_output(c, "dz", p.dz, p.fwd.z, true));
  TPF_RETURN_IF_ERROR(c.writable("dz", p.dz));
  if (p.dz_in.present()) {
    TPF_RETURN_IF_ERROR(check_output(c, "dz_in", p.dz_in, p.fwd.z, true));
    TPF_RETURN_IF_ERROR(c.dtype("dz_in", p.dz_in, {p.dz.dtype}));
  }
  const TrimulWeights &w = p.fwd.w, &g = p.dw;
  TPF_RETURN_IF_ERROR(check_grad(c, "d_norm_in_weight", g.norm_in_weight, w.norm_in_weight));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_norm_in_bias", g.norm_in_bias, w.norm_in_bias));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_p_in_weight", g.p_in_weight, w.p_in_weight));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_p_in_bias", g.p_in_bias, w.p_in_bias));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_g_in_weight", g.g_in_weight, w.g_in_weight));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_g_in_bias", g.g_in_bias, w.g_in_bias));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_norm_out_weight", g.norm_out_weight, w.norm_out_weight));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_norm_out_bias", g.norm_out_bias, w.norm_out_bias));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_p_out_weight", g.p_out_weight, w.p_out_weight));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_p_out_bias", g.p_out_bias, w.p_out_bias));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_g_out_weight", g.g_out_weight, w.g_out_weight));
  TPF_RETURN_IF_ERROR(check_grad(c, "d_g_out_bias", g.g_out_bias, w.g_out_bias));
  return Status::Ok();
}
}  // namespace tpf
