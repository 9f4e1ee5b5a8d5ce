// FP64 CPU reference of the fused gated output projection: the same formula with every
// intermediate in double (no bf16 rounding), for the tests' tolerances from the bf16 floor.
#include <vector>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "reference/ref_math.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::store;

// Element (row r = (b I + i) J + j, channel n) of a [B, I, J, N] tensor.
int64_t pair_offset(const TensorView& t, int64_t r, int64_t n) {
  const int64_t J = t.shape[2], I = t.shape[1];
  return t.offset({r / (I * J), (r / J) % I, r % J, n});
}

}  // namespace

Status gated_linear_forward(const GatedLinearParams& p) {
  TPF_RETURN_IF_ERROR(validate_gated_linear(p, false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "gated_linear", {{"g", p.g.data}, {"o", p.o.data}, {"w", p.w.data}, {"bias", p.bias.data}, {"x", p.x.data},
                       {"scale", p.scale.data}, {"out", p.out.data}}));
  const int64_t R = p.out.shape[0] * p.out.shape[1] * p.out.shape[2], N = p.w.shape[0], K = p.w.shape[1];
  std::vector<double> h(K);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < K; ++k) h[k] = sigmoid(load(p.g, p.g.offset({r, k}))) * load(p.o, p.o.offset({r, k}));
    for (int64_t n = 0; n < N; ++n) {
      double y = p.bias.present() ? load(p.bias, n) : 0.0;
      for (int64_t k = 0; k < K; ++k) y += h[k] * load(p.w, n * K + k);
      if (p.x.present())
        y = load(p.x, pair_offset(p.x, r, n)) + (p.scale.present() ? load(p.scale, pair_offset(p.scale, r, n)) : 1.0) * y;
      store(p.out, pair_offset(p.out, r, n), y);
    }
  }
  return Status::Ok();
}

}  // namespace tpf::reference
