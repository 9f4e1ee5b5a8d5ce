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
                                          {"d_o", p.d_o.data},
                                          {"out_residual", p.out_residual.data},
                                          {"delta", p.delta.data}});
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
  if (!p.delta.present()) return Status::Ok();
  // delta: each head's sum of do (as stored) (o + out_residual), in FP64
  const int64_t I = p.delta.shape[1], J = p.delta.shape[2], H = p.delta.shape[3], D = p.g.shape[1] / H;
  for (int64_t r = 0; r < p.g.shape[0]; ++r)
    for (int64_t h = 0; h < H; ++h) {
      double sum = 0.0;
      for (int64_t j = h * D; j < (h + 1) * D; ++j) {
        const double res = p.out_residual.present() ? load(p.out_residual, p.out_residual.offset({r, j})) : 0.0;
        sum += load(p.d_o, p.d_o.offset({r, j})) * (load(p.o, p.o.offset({r, j})) + res);
      }
      store(p.delta, p.delta.offset({r / (I * J), (r / J) % I, r % J, h}), sum);
    }
  return Status::Ok();
}

}  // namespace tpf::reference
