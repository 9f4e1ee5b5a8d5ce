// A random triangle-attention problem allocated on the device (B = 1, contiguous, 16-bit inputs,
// a bias in their dtype or fp32, a bool key mask), with the parameter structs that point at it.
// Shared by `tpf bench` and `tpf accuracy`; inputs are generated on the device (no host transfer).
#pragma once
#include <cstdint>
#include <stdexcept>

#include "testing/device_buffer.h"
#include "testing/device_random.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::harness {

struct DeviceAttention {
  int S, H, N, D;
  DeviceBuffer q, k, v, dout, out, res, dq, dk, dv, bias, dbias, mask, lse, workspace;
  AttentionForwardParams fwd;
  AttentionBackwardParams bwd;
  size_t workspace_bytes = 0;

  // dtype: the activations' (kBF16 or kFP16); bias_dtype: the bias's and dbias's (dtype or kFP32).
  DeviceAttention(int S_, int H_, int N_, int D_, uint64_t seed, double keep = 0.8,
                  bool compensate = true, bool with_dbias = true, DType dtype = DType::kBF16,
                  DType bias_dtype = DType::kBF16)
      : S(S_), H(H_), N(N_), D(D_) {
    const int64_t x = int64_t{S} * H * N * D, plane = int64_t{H} * N * N;
    for (DeviceBuffer* b : {&q, &k, &v, &dout, &out, &res, &dq, &dk, &dv}) *b = DeviceBuffer(x * dtype_size(dtype));
    bias = DeviceBuffer(plane * dtype_size(bias_dtype));
    dbias = DeviceBuffer(plane * dtype_size(bias_dtype));
    mask = DeviceBuffer(int64_t{S} * N);
    lse = DeviceBuffer(int64_t{S} * H * N * 4);
    for (DeviceBuffer* b : {&q, &k, &v, &dout})
      cuda_ok(fill_normal_device(b->get(), dtype, x, seed++), "fill");
    cuda_ok(fill_normal_device(bias.get(), bias_dtype, plane, seed++), "fill");
    cuda_ok(fill_mask_device(static_cast<uint8_t*>(mask.get()), int64_t{S} * N, keep, seed), "fill");

    auto act = [&](DeviceBuffer& b) { return contiguous_view(b.get(), dtype, {1, S, H, N, D}); };
    fwd.q = bwd.q = act(q);
    fwd.k = bwd.k = act(k);
    fwd.v = bwd.v = act(v);
    fwd.bias = bwd.bias = contiguous_view(bias.get(), bias_dtype, {1, 1, H, N, N});
    fwd.mask = bwd.mask = contiguous_view(mask.get(), DType::kBool, {1, S, 1, 1, N});
    fwd.out = bwd.out = act(out);
    fwd.out_residual = bwd.out_residual = act(res);
    fwd.lse = bwd.lse = contiguous_view(lse.get(), DType::kFP32, {1, S, H, N});
    fwd.compensate = bwd.compensate = compensate;
    bwd.dout = act(dout);
    bwd.dq = act(dq);
    bwd.dk = act(dk);
    bwd.dv = act(dv);
    if (with_dbias) bwd.dbias = contiguous_view(dbias.get(), bias_dtype, {1, 1, H, N, N});
    check(attention_backward_workspace_size(bwd, &workspace_bytes));
    workspace = DeviceBuffer(workspace_bytes);
  }

  void forward() { check(attention_forward(fwd, nullptr)); }
  void backward() { check(attention_backward(bwd, workspace.get(), workspace_bytes, nullptr)); }

  static void check(const Status& s) {
    if (!s.ok()) throw std::runtime_error(s.message());
  }
};

}  // namespace tpf::harness
