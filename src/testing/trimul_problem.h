// A random triangle-multiplicative-update problem on the host.
#pragma once
#include "testing/host_tensor.h"

namespace tpf::test {

struct TrimulProblem {
  int64_t B, N, C, Ch;
  HostTensor z, mask, out, dout, dz;
  HostTensor dz_in;          // optional addend of dz (absent: no data)
  // The residual update around the op (absent: no data): out = residual + scale * update;
  // scale may be a broadcast view (stride 0).
  HostTensor residual, scale;
  bool dz_in_alias = false;  // the GPU harness passes dz_in as dz itself (dz starts as dz_in)
  // Weights and gradients, in TrimulWeights order.
  static constexpr int kWeights = 12;
  HostTensor w[kWeights], dw[kWeights];
  bool biases = true, has_mask = true;
  TrimulDirection direction = TrimulDirection::kOutgoing;

  static const char* weight_name(int i) {
    static const char* names[kWeights] = {
        "norm_in_weight", "norm_in_bias", "p_in_weight",     "p_in_bias",
        "g_in_weight",    "g_in_bias",    "norm_out_weight", "norm_out_bias",
        "p_out_weight",   "p_out_bias",   "g_out_weight",    "g_out_bias"};
    return names[i];
  }

  std::vector<int64_t> weight_shape(int i) const {
    switch (i) {
      case 0: case 1: return {C};
      case 2: case 4: return {2 * Ch, C};
      case 3: case 5: return {2 * Ch};
      case 6: case 7: return {Ch};
      case 8: return {C, Ch};
      case 10: return {C, C};
      default: return {C};  // 9, 11
    }
  }

  // Makes this a residual update: a random residual (dtype res, where out then lands) and a
  // dropout-like scale (0 or 1/0.75) shared along i (a broadcast view). dout stays the update's
  // gradient.
  void add_residual(DType res, DType scale_dtype, uint64_t seed) {
    std::mt19937_64 rng(seed);
    residual = HostTensor::make(res, {B, N, N, C});
    residual.fill_normal(rng);
    scale = HostTensor::make(scale_dtype, {B, 1, N, C});
    std::bernoulli_distribution keep(0.75);
    scale.for_each([&](int64_t, int64_t off) { scale.set(off, keep(rng) ? 1.0 / 0.75 : 0.0); });
    scale.view.shape[1] = N;
    scale.view.stride[1] = 0;
    out = HostTensor::make(res, {B, N, N, C});
  }

  static TrimulProblem random(int64_t B, int64_t N, int64_t C, int64_t Ch, uint64_t seed,
                              DType act = DType::kFP64, DType wdt = DType::kFP64) {
    std::mt19937_64 rng(seed);
    TrimulProblem p{B, N, C, Ch};
    p.z = HostTensor::make(act, {B, N, N, C});
    p.z.fill_normal(rng);
    p.dout = HostTensor::make(act, {B, N, N, C});
    p.dout.fill_normal(rng);
    p.out = HostTensor::make(act, {B, N, N, C});
    p.dz = HostTensor::make(act, {B, N, N, C});
    p.mask = HostTensor::make(DType::kFP64, {B, N, N});
    std::bernoulli_distribution keep(0.8);
    p.mask.for_each([&](int64_t, int64_t off) { p.mask.set(off, keep(rng) ? 1.0 : 0.0); });
    for (int i = 0; i < kWeights; ++i) {
      p.w[i] = HostTensor::make(wdt, p.weight_shape(i));
      const bool ln_gain = i == 0 || i == 6;
      p.w[i].fill_normal(rng, ln_gain ? 0.2 : 0.5);
      if (ln_gain) p.w[i].for_each([&](int64_t, int64_t off) { p.w[i].set(off, 1.0 + p.w[i].at(off)); });
      p.dw[i] = HostTensor::make(wdt, p.weight_shape(i));
    }
    return p;
  }

  TrimulWeights weights(HostTensor* t) const {
    TrimulWeights w;
    TensorView* f[kWeights] = {&w.norm_in_weight, &w.norm_in_bias, &w.p_in_weight,
                               &w.p_in_bias,      &w.g_in_weight,  &w.g_in_bias,
                               &w.norm_out_weight, &w.norm_out_bias, &w.p_out_weight,
                               &w.p_out_bias,     &w.g_out_weight, &w.g_out_bias};
    for (int i = 0; i < kWeights; ++i) {
      const bool optional_bias = i == 3 || i == 5 || i == 9 || i == 11;
      if (!optional_bias || biases) *f[i] = t[i].view;
    }
    return w;
  }

  TrimulForwardParams fwd() {
    TrimulForwardParams f;
    f.z = z.view;
    if (has_mask) f.mask = mask.view;
    f.w = weights(w);
    f.direction = direction;
    f.out = out.view;
    if (residual.view.data) f.residual = residual.view;
    if (scale.view.data) f.scale = scale.view;
    return f;
  }

  TrimulBackwardParams bwd() {
    TrimulBackwardParams b;
    b.fwd = fwd();
    b.dout = dout.view;
    b.dz = dz.view;
    if (dz_in.view.data) b.dz_in = dz_in.view;
    b.dw = weights(dw);
    return b;
  }
};

}  // namespace tpf::test
