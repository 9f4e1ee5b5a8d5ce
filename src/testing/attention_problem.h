// A random triangle-attention problem on the host (inputs, outputs, gradients) and the
// parameter structs that point at it. Shared by the CPU and GPU suites.
#pragma once
#include "testing/host_tensor.h"

namespace tpf::test {

struct AttnShape {
  int64_t B = 1, S = 2, H = 2, N = 5, D = 4;
};

struct AttnProblem {
  AttnShape sh;
  HostTensor q, k, v, bias, mask, out, res, lse, dout, dq, dk, dv, dbias;
  bool has_mask = true;

  // `order` is the physical dim order of q, k, v, dout and the gradients ({0,1,3,2,4} is
  // OpenFold3's [B,S,N,H,D]); `pad` pads their strides.
  static AttnProblem random(const AttnShape& s, uint64_t seed, DType act = DType::kFP64,
                            DType bias_dt = DType::kFP64, double keep = 0.8,
                            std::vector<int> order = {}, int64_t pad = 0) {
    std::mt19937_64 rng(seed);
    AttnProblem p;
    p.sh = s;
    const std::vector<int64_t> x = {s.B, s.S, s.H, s.N, s.D};
    for (HostTensor* t : {&p.q, &p.k, &p.v, &p.dout}) {
      *t = HostTensor::make(act, x, order, pad);
      t->fill_normal(rng);
    }
    p.bias = HostTensor::make(bias_dt, {s.B, 1, s.H, s.N, s.N});
    p.bias.fill_normal(rng);
    p.mask = random_key_mask(rng, s.B, s.S, s.N, keep);
    for (HostTensor* t : {&p.out, &p.res, &p.dq, &p.dk, &p.dv}) *t = HostTensor::make(act, x, order, pad);
    p.lse = HostTensor::make(DType::kFP32, {s.B, s.S, s.H, s.N});
    p.dbias = HostTensor::make(bias_dt, {s.B, 1, s.H, s.N, s.N});
    return p;
  }

  // The same input values in FP64, contiguous: the exact problem the reference solves.
  AttnProblem to_fp64() const {
    AttnProblem r = random(sh, 0, DType::kFP64, DType::kFP64);
    r.has_mask = has_mask;
    for (auto m : {&AttnProblem::q, &AttnProblem::k, &AttnProblem::v, &AttnProblem::dout,
                   &AttnProblem::bias, &AttnProblem::mask})
      (r.*m).set_values((this->*m).values());
    return r;
  }

  AttentionForwardParams fwd() {
    AttentionForwardParams f;
    f.q = q.view;
    f.k = k.view;
    f.v = v.view;
    f.bias = bias.view;
    if (has_mask) f.mask = mask.view;
    f.out = out.view;
    f.out_residual = res.view;
    f.lse = lse.view;
    return f;
  }

  AttentionBackwardParams bwd() {
    AttentionBackwardParams b;
    b.q = q.view;
    b.k = k.view;
    b.v = v.view;
    b.bias = bias.view;
    if (has_mask) b.mask = mask.view;
    b.out = out.view;
    b.out_residual = res.view;
    b.lse = lse.view;
    b.dout = dout.view;
    b.dq = dq.view;
    b.dk = dk.view;
    b.dv = dv.view;
    b.dbias = dbias.view;
    return b;
  }
};

}  // namespace tpf::test
