// A random multiplicative-update problem allocated on the device (contiguous, bf16 z, dout and
// weights, a bool pair mask, every bias present), with the parameter structs that point at it.
// Used by `tpf bench --op trimul`; inputs are generated on the device.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "testing/device_buffer.h"
#include "testing/device_random.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::harness {

struct DeviceTrimul {
  int64_t B, N, C, Ch;
  DeviceBuffer z, dout, out, dz, mask, fwd_ws, bwd_ws, saved;
  std::vector<DeviceBuffer> w, dw;
  TrimulForwardParams fwd;
  TrimulBackwardParams bwd;
  size_t fwd_bytes = 0, bwd_bytes = 0, saved_bytes = 0, fwd_saving_bytes = 0, bwd_saved_bytes = 0;

  DeviceTrimul(int64_t B_, int64_t N_, int64_t C_, int64_t Ch_, bool outgoing, uint64_t seed)
      : B(B_), N(N_), C(C_), Ch(Ch_) {
    const int64_t pairs = B * N * N;
    for (DeviceBuffer* b : {&z, &dout, &out, &dz}) *b = DeviceBuffer(pairs * C * 2);
    mask = DeviceBuffer(pairs);
    cuda_ok(fill_normal_device(z.get(), DType::kBF16, pairs * C, seed++), "fill");
    cuda_ok(fill_normal_device(dout.get(), DType::kBF16, pairs * C, seed++), "fill");
    cuda_ok(fill_mask_device(static_cast<uint8_t*>(mask.get()), pairs, 0.9, seed++), "fill");
    const std::vector<std::vector<int64_t>> shapes = {{C}, {C}, {2 * Ch, C}, {2 * Ch}, {2 * Ch, C}, {2 * Ch},
                                                      {Ch}, {Ch}, {C, Ch}, {C}, {C, C}, {C}};
    TensorView* fw[12] = {&fwd.w.norm_in_weight, &fwd.w.norm_in_bias, &fwd.w.p_in_weight,
                          &fwd.w.p_in_bias, &fwd.w.g_in_weight, &fwd.w.g_in_bias,
                          &fwd.w.norm_out_weight, &fwd.w.norm_out_bias, &fwd.w.p_out_weight,
                          &fwd.w.p_out_bias, &fwd.w.g_out_weight, &fwd.w.g_out_bias};
    TensorView* gw[12] = {&bwd.dw.norm_in_weight, &bwd.dw.norm_in_bias, &bwd.dw.p_in_weight,
                          &bwd.dw.p_in_bias, &bwd.dw.g_in_weight, &bwd.dw.g_in_bias,
                          &bwd.dw.norm_out_weight, &bwd.dw.norm_out_bias, &bwd.dw.p_out_weight,
                          &bwd.dw.p_out_bias, &bwd.dw.g_out_weight, &bwd.dw.g_out_bias};
    for (int i = 0; i < 12; ++i) {
      int64_t n = 1;
      for (int64_t s : shapes[i]) n *= s;
      w.emplace_back(n * 2);
      dw.emplace_back(n * 2);
      cuda_ok(fill_normal_device(w.back().get(), DType::kBF16, n, seed++), "fill");
      auto view = [&](void* p) {
        return shapes[i].size() == 1 ? contiguous_view(p, DType::kBF16, {shapes[i][0]})
                                     : contiguous_view(p, DType::kBF16, {shapes[i][0], shapes[i][1]});
      };
      *fw[i] = view(w.back().get());
      *gw[i] = view(dw.back().get());
    }
    fwd.z = contiguous_view(z.get(), DType::kBF16, {B, N, N, C});
    fwd.mask = contiguous_view(mask.get(), DType::kBool, {B, N, N});
    fwd.out = contiguous_view(out.get(), DType::kBF16, {B, N, N, C});
    fwd.direction = outgoing ? TrimulDirection::kOutgoing : TrimulDirection::kIncoming;
    bwd.fwd = fwd;
    bwd.dout = contiguous_view(dout.get(), DType::kBF16, {B, N, N, C});
    bwd.dz = contiguous_view(dz.get(), DType::kBF16, {B, N, N, C});
    // Workspace sizes of both paths: inference forward / backward that recomputes, and the
    // training pair (saving forward, backward from the saved set).
    check(trimul_forward_workspace_size(fwd, &fwd_bytes));
    check(trimul_backward_workspace_size(bwd, &bwd_bytes));
    check(trimul_saved_size(fwd, &saved_bytes));
    TrimulForwardParams f = fwd;
    f.saved = &f;  // any non-null pointer: the sizes only depend on its presence
    check(trimul_forward_workspace_size(f, &fwd_saving_bytes));
    TrimulBackwardParams b = bwd;
    b.fwd.saved = &f;
    check(trimul_backward_workspace_size(b, &bwd_saved_bytes));
  }

  // Inference forward (keeps nothing).
  void forward() { check(trimul_forward(fwd, workspace(fwd_ws, fwd_bytes), fwd_bytes, nullptr)); }
  // Training pair: the forward writes the saved set (allocated on first use), the backward
  // reads it.
  void forward_saving() {
    if (!saved.get()) saved = DeviceBuffer(saved_bytes);
    TrimulForwardParams f = fwd;
    f.saved = saved.get(), f.saved_bytes = saved_bytes;
    check(trimul_forward(f, workspace(fwd_ws, fwd_saving_bytes), fwd_saving_bytes, nullptr));
  }
  void backward() {
    if (!saved.get()) throw std::runtime_error("DeviceTrimul::backward: call forward_saving() first");
    TrimulBackwardParams b = bwd;
    b.fwd.saved = saved.get(), b.fwd.saved_bytes = saved_bytes;
    check(trimul_backward(b, workspace(bwd_ws, bwd_saved_bytes), bwd_saved_bytes, nullptr));
  }
  // The backward that recomputes the forward (no saved set).
  void backward_recompute() { check(trimul_backward(bwd, workspace(bwd_ws, bwd_bytes), bwd_bytes, nullptr)); }

  // A workspace of at least `bytes`, allocated when a path first needs it (or more than it holds):
  // at large N the recompute path's workspace, which holds a saved set of its own, and the
  // training pair's buffers would not fit one device together.
  static void* workspace(DeviceBuffer& ws, size_t bytes) {
    if (ws.bytes() < bytes) {
      ws = DeviceBuffer();  // freed before the larger one is taken
      ws = DeviceBuffer(bytes);
    }
    return ws.get();
  }

  static void check(const Status& s) {
    if (!s.ok()) throw std::runtime_error(s.message());
  }
};

}  // namespace tpf::harness
