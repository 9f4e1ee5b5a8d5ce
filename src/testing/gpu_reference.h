// A naive FP64 triangle-attention reference on the GPU, for accuracy tables at sizes where the
// CPU reference would take minutes. It is itself checked against the CPU reference (the oracle)
// by the GPU tests. Inputs are contiguous device tensors of any float dtype; outputs are FP64.
#pragma once
#include <cuda_runtime.h>

#include "turbopairformer/tensor.h"

namespace tpf::harness {

struct RefAttnDevice {
  TensorView q, k, v, bias, mask, dout;  // contiguous; mask may be absent
  double scale;
  // FP64 outputs, contiguous: out/dq/dk/dv [B,S,H,N,D], lse/delta [B,S,H,N], dbias [B,H,N,N].
  double *out, *lse, *delta, *dq, *dk, *dv, *dbias;
};

cudaError_t reference_attention_device(const RefAttnDevice& r, cudaStream_t stream = nullptr);

// Sums over i of (x_i - ref_i)^2, ref_i^2 and (round(ref_i, floor_dtype) - ref_i)^2, with x a
// contiguous device tensor of any dtype and ref FP64; returns rel. RMSE and its floor.
cudaError_t relative_rmse_device(const TensorView& x, const double* ref, DType floor_dtype,
                                 double* rel_rmse, double* floor);

}  // namespace tpf::harness
