// FP64 CPU reference of the sigmoid gate, forward and backward.
#include <cmath>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "reference/ref_math.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::store;

Status check_host(const char* op, const SigmoidGateParams& p) {
  return detail::check_host_pointers(op, {{"g", p.g.data},
                                          {"o", p.o.data},
                                          {"y", p.y.data},
                                          {"dy", p.dy.data},
                                          {"dg", p.dg.data},
                                          {"d_o", p.d_o.data}});
}

}  // namespace

Status sigmoid_gate_forward(const SigmoidGateParams& p) {
  TPF_RETURN_IF_ERROR(validate_sigmoid_gate(p, false, false));
  TPF_RETURN_IF_ERROR(check_host("sigmoid_gate", p));
  for (int64_t r = 0; r < p.g.shape[0]; ++r)
    for (int64_t j = 0; j < p.g.shape[1]; ++j)
      store(p.y, p.y.offset({r, j}), sigmoid(load(p.g, p.g.offset({r, j}))) * load(p.o, p.o.offset({r, j})));
  return Status::Ok();
}

Status sigmoid_gate_backward(const SigmoidGateParams& p) {
  TPF_RETURN_IF_ERROR(validate_sigmoid_gate(p, true, false));
  TPF_RETURN_IF_ERROR(check_host("sigmoid_gate_backward", p));
  for (int64_t r = 0; r < p.g.shape[0]; ++r)
    for (int64_t j = 0; j < p.g.shape[1]; ++j) {
      const double s = sigmoid(load(p.g, p.g.offset({r, j}))), o = load(p.o, p.o.offset({r, j}));
      const double dy = load(p.dy, p.dy.offset({r, j}));
      store(p.dg, p.dg.offset({r, j}), dy * o * s * (1.0 - s));
      store(p.d_o, p.d_o.offset({r, j}), dy * s);
      if (p.y.present()) store(p.y, p.y.offset({r, j}), s * o);
    }
  return Status::Ok();
}

}  // namespace tpf::reference
