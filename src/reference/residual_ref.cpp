// FP64 CPU reference of the residual update and its branch gradient.
#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::store;

// f(flat offset of a contiguous [B, I, J, C] tensor, scale at that index (1 when absent)).
template <class F>
void each(const TensorView& like, const TensorView& scale, F&& f) {
  int64_t at = 0;
  for (int64_t b = 0; b < like.shape[0]; ++b)
    for (int64_t i = 0; i < like.shape[1]; ++i)
      for (int64_t j = 0; j < like.shape[2]; ++j)
        for (int64_t c = 0; c < like.shape[3]; ++c, ++at)
          f(at, scale.present() ? load(scale, scale.offset({b, i, j, c})) : 1.0);
}

}  // namespace

Status residual_forward(const ResidualParams& p) {
  TPF_RETURN_IF_ERROR(validate_residual(p, false, false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "residual", {{"z", p.z.data}, {"u", p.u.data}, {"scale", p.scale.data}, {"out", p.out.data}}));
  each(p.z, p.scale, [&](int64_t at, double s) { store(p.out, at, load(p.z, at) + s * load(p.u, at)); });
  return Status::Ok();
}

Status residual_backward(const ResidualParams& p) {
  TPF_RETURN_IF_ERROR(validate_residual(p, true, false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "residual_backward", {{"dout", p.dout.data}, {"scale", p.scale.data}, {"du", p.du.data}}));
  each(p.dout, p.scale, [&](int64_t at, double s) { store(p.du, at, load(p.dout, at) * s); });
  return Status::Ok();
}

}  // namespace tpf::reference
