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
  return detail::check_host_pointers(op, {{"x", p.x.data}, {"y", p.y.data}, {"dy", p.dy.data}, {"dx", p.dx.data}});
}

}  // namespace

Status swiglu_forward(const SwigluParams& p) {
  TPF_RETURN_IF_ERROR(validate_swiglu(p, false, false));
  TPF_RETURN_IF_ERROR(check_host("swiglu", p));
  const int64_t H = p.x.shape[p.x.rank - 1] / 2, rows = H ? p.x.numel() / (2 * H) : 0;
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
      const double a = load(p.x, m * 2 * H + j), b = load(p.x, m * 2 * H + H + j), g = load(p.dy, m * H + j);
      const double s = sigmoid(a);
      store(p.dx, m * 2 * H + j, g * b * s * (1.0 + a * (1.0 - s)));
      store(p.dx, m * 2 * H + H + j, g * a * s);
      if (p.y.present()) store(p.y, m * H + j, a * s * b);
    }
  return Status::Ok();
}

}  // namespace tpf::reference
