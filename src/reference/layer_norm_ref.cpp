// FP64 CPU reference of the LayerNorm, forward and backward: plain loops in double over the
// rows of the contiguous x, rounding once into each output's dtype.
#include <cmath>
#include <vector>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "turbopairformer/layer_norm.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::store;

struct RowStats {
  double mean, rstd;
};

// One row's statistics and xhat (n = W values from element offset `at` of a contiguous x).
RowStats normalize(const TensorView& x, int64_t at, int64_t W, double eps, std::vector<double>& xhat) {
  double s = 0.0;
  for (int64_t c = 0; c < W; ++c) s += xhat[c] = load(x, at + c);
  const double mean = s / W;
  double q = 0.0;
  for (int64_t c = 0; c < W; ++c) q += (xhat[c] - mean) * (xhat[c] - mean);
  const double rstd = 1.0 / std::sqrt(q / W + eps);
  for (int64_t c = 0; c < W; ++c) xhat[c] = (xhat[c] - mean) * rstd;
  return {mean, rstd};
}

double param(const TensorView& t, int64_t c, double absent) { return t.present() ? load(t, c * t.stride[0]) : absent; }

}  // namespace

Status layer_norm_forward(const LayerNormForwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_layer_norm_forward(p, /*for_gpu=*/false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "layer_norm", {{"x", p.x.data}, {"weight", p.weight.data}, {"bias", p.bias.data}, {"y", p.y.data},
                     {"mean", p.mean.data}, {"rstd", p.rstd.data}}));
  const int64_t W = p.x.shape[p.x.rank - 1], rows = p.x.numel() / W;
  std::vector<double> xh(W);
  for (int64_t r = 0; r < rows; ++r) {
    const RowStats st = normalize(p.x, r * W, W, p.eps, xh);
    for (int64_t c = 0; c < W; ++c) store(p.y, r * W + c, xh[c] * param(p.weight, c, 1.0) + param(p.bias, c, 0.0));
    if (p.mean.present()) store(p.mean, r, st.mean), store(p.rstd, r, st.rstd);
  }
  return Status::Ok();
}

// Recomputes the statistics from x (the given mean and rstd are the forward's rounding of them).
Status layer_norm_backward(const LayerNormBackwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_layer_norm_backward(p, /*for_gpu=*/false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "layer_norm_backward", {{"x", p.fwd.x.data}, {"weight", p.fwd.weight.data}, {"dy", p.dy.data},
                              {"dx", p.dx.data}, {"dx_in", p.dx_in.data}, {"dweight", p.dweight.data}, {"dbias", p.dbias.data}}));
  const LayerNormForwardParams& f = p.fwd;
  const int64_t W = f.x.shape[f.x.rank - 1], rows = f.x.numel() / W;
  std::vector<double> xh(W), g(W), dw(W, 0.0), db(W, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const RowStats st = normalize(f.x, r * W, W, f.eps, xh);
    double mg = 0.0, mgx = 0.0;
    for (int64_t c = 0; c < W; ++c) {
      const double dy = load(p.dy, r * W + c);
      dw[c] += dy * xh[c], db[c] += dy;
      g[c] = dy * param(f.weight, c, 1.0);
      mg += g[c], mgx += g[c] * xh[c];
    }
    mg /= W, mgx /= W;
    for (int64_t c = 0; c < W; ++c) {
      const double add = p.dx_in.present() ? load(p.dx_in, r * W + c) : 0.0;
      store(p.dx, r * W + c, add + st.rstd * (g[c] - mg - xh[c] * mgx));
    }
  }
  for (int64_t c = 0; c < W; ++c) {
    if (p.dweight.present()) store(p.dweight, c * p.dweight.stride[0], dw[c]);
    if (p.dbias.present()) store(p.dbias, c * p.dbias.stride[0], db[c]);
  }
  return Status::Ok();
}

}  // namespace tpf::reference
