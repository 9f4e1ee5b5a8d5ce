// FP64 CPU reference of the fused SwiGLU transition, forward and the backward's middle: the
// same formulas with every intermediate in double (no bf16 rounding), for the tests' tolerances
// from the bf16 floor.
#include <cmath>
#include <vector>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "reference/ref_math.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {

using detail::load;
using detail::store;

Status transition_forward(const TransitionParams& p) {
  TPF_RETURN_IF_ERROR(validate_transition(p, false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "transition", {{"x", p.x.data}, {"ln_w", p.ln_w.data}, {"ln_b", p.ln_b.data}, {"w_ab", p.w_ab.data},
                     {"w_o", p.w_o.data}, {"scale", p.scale.data}, {"out", p.out.data}, {"xhat", p.xhat.data},
                     {"mean", p.mean.data}, {"rstd", p.rstd.data}}));
  const int64_t C = p.x.shape[p.x.rank - 1], R = p.x.numel() / C, H = p.w_ab.shape[0] / 2;
  std::vector<double> xh(C), h(H);
  for (int64_t r = 0; r < R; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += load(p.x, r * C + c);
    mean /= C;
    for (int64_t c = 0; c < C; ++c) var += (load(p.x, r * C + c) - mean) * (load(p.x, r * C + c) - mean);
    const double rstd = 1.0 / std::sqrt(var / C + p.eps);
    for (int64_t c = 0; c < C; ++c)
      xh[c] = (load(p.x, r * C + c) - mean) * rstd * (p.ln_w.present() ? load(p.ln_w, c) : 1.0) +
              (p.ln_b.present() ? load(p.ln_b, c) : 0.0);
    for (int64_t k = 0; k < H; ++k) {
      double a = 0, b = 0;
      for (int64_t c = 0; c < C; ++c) a += xh[c] * load(p.w_ab, k * C + c), b += xh[c] * load(p.w_ab, (H + k) * C + c);
      h[k] = a * sigmoid(a) * b;
    }
    const double s = p.scale.present() ? load(p.scale, r) : 1.0;
    for (int64_t c = 0; c < C; ++c) {
      double y = 0;
      for (int64_t k = 0; k < H; ++k) y += h[k] * load(p.w_o, c * H + k);
      store(p.out, r * C + c, p.residual ? load(p.x, r * C + c) + s * y : y);
      if (p.xhat.present()) store(p.xhat, r * C + c, xh[c]);
    }
    if (p.mean.present()) store(p.mean, r, mean);
    if (p.rstd.present()) store(p.rstd, r, rstd);
  }
  return Status::Ok();
}

Status transition_backward(const TransitionBackwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_transition_backward(p, false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "transition_backward", {{"xhat", p.xhat.data}, {"g", p.g.data}, {"w_ab", p.w_ab.data}, {"w_o", p.w_o.data},
                              {"h", p.h.data}, {"dab", p.dab.data}, {"dxhat", p.dxhat.data}}));
  const int64_t C = p.xhat.shape[p.xhat.rank - 1], R = p.xhat.numel() / C, H = p.w_ab.shape[0] / 2;
  std::vector<double> dab(2 * H);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < H; ++k) {
      double a = 0, b = 0, dh = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double xh = load(p.xhat, r * C + c);
        a += xh * load(p.w_ab, k * C + c), b += xh * load(p.w_ab, (H + k) * C + c);
        dh += load(p.g, r * C + c) * load(p.w_o, c * H + k);
      }
      const double s = sigmoid(a);
      dab[k] = dh * b * s * (1 + a * (1 - s)), dab[H + k] = dh * a * s;
      store(p.h, r * H + k, a * s * b);
      store(p.dab, r * 2 * H + k, dab[k]);
      store(p.dab, r * 2 * H + H + k, dab[H + k]);
    }
    for (int64_t c = 0; c < C; ++c) {
      double dx = 0;
      for (int64_t k = 0; k < 2 * H; ++k) dx += dab[k] * load(p.w_ab, k * C + c);
      store(p.dxhat, r * C + c, dx);
    }
  }
  return Status::Ok();
}

}  // namespace tpf::reference
