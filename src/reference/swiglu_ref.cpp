// FP64 CPU reference of the SwiGLU activation, forward and backward.
#include <cmath>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "reference/ref_math.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::store;

Status check_host(const char* op, const SwigluParams& p) {
  return detail::check_host_pointers(op, {{"x", p.x.data}, {"y", p.y.data}, {"dy", p.dy.data}, {"dx", p.dx.data},
                                          {"u", p.u.data}, {"w_up", p.w_up.data}, {"g", p.g.data},
                                          {"w_down", p.w_down.data}});
}

// w_up's row for column n of x = [a | b] (64-row blocks alternating a and b, swiglu.h).
int64_t blocked_row(int64_t n, int64_t H) {
  const int64_t half = n >= H, j = n - half * H;
  return (j / 64) * 128 + half * 64 + j % 64;
}

// x = u w_upᵀ, stored in x's dtype.
void project(const SwigluParams& p, int64_t rows, int64_t H) {
  const int64_t C = p.u.shape[p.u.rank - 1];
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < 2 * H; ++n) {
      double acc = 0;
      const int64_t r = blocked_row(n, H);
      for (int64_t k = 0; k < C; ++k) acc += load(p.u, m * C + k) * load(p.w_up, r * C + k);
      store(p.x, m * 2 * H + n, acc);
    }
}

// dy[m, j]: given, or (g w_down)[m, j].
double dy_at(const SwigluParams& p, int64_t m, int64_t j, int64_t H) {
  if (!p.g.present()) return load(p.dy, m * H + j);
  const int64_t C = p.g.shape[p.g.rank - 1];
  double acc = 0;
  for (int64_t k = 0; k < C; ++k) acc += load(p.g, m * C + k) * load(p.w_down, k * H + j);
  return acc;
}

}  // namespace

Status swiglu_forward(const SwigluParams& p) {
  TPF_RETURN_IF_ERROR(validate_swiglu(p, false, false));
  TPF_RETURN_IF_ERROR(check_host("swiglu", p));
  const int64_t H = p.x.shape[p.x.rank - 1] / 2, rows = H ? p.x.numel() / (2 * H) : 0;
  if (p.u.present()) project(p, rows, H);  // then y from x as stored, as on the GPU
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < H; ++j) {
      const double a = load(p.x, m * 2 * H + j), b = load(p.x, m * 2 * H + H + j);
      store(p.y, m * H + j, a * sigmoid(a) * b);
    }
  return Status::Ok();
}

Status swiglu_backward(const SwigluParams& p) {
  TPF_RETURN_IF_ERROR(validate_swiglu(p, true, false));
  TPF_RETURN_IF_ERROR(check_host("swiglu_backward", p));
  const int64_t H = p.x.shape[p.x.rank - 1] / 2, rows = H ? p.x.numel() / (2 * H) : 0;
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < H; ++j) {
      const double a = load(p.x, m * 2 * H + j), b = load(p.x, m * 2 * H + H + j), g = dy_at(p, m, j, H);
      const double s = sigmoid(a);
      store(p.dx, m * 2 * H + j, g * b * s * (1.0 + a * (1.0 - s)));
      store(p.dx, m * 2 * H + H + j, g * a * s);
      if (p.y.present()) store(p.y, m * H + j, a * s * b);
    }
  return Status::Ok();
}

}  // namespace tpf::reference
