// Triangle attention (docs/DESIGN.md section 1): public parameter structs and entry points.
//
//   S[b,s,h,q,k] = scale * <Q[b,s,h,q,:], K[b,s,h,k,:]> + bias[b,0,h,q,k]   (mask false -> -inf)
//   P = softmax_k(S),  O = P V
//
// Shapes (B batch, S slices, H heads, N sequence, D head dim):
//   q, k, v, out, out_residual, dout, dq, dk, dv : [B,S,H,N,D]   head-dim stride must be 1
//   bias, dbias                                  : [B,1,H,N,N]
//   mask (optional)                              : [B,S,1,1,N]   bool, true = attend
//   lse                                          : [B,S,H,N]     fp32, natural-log sum-exp
// Every other stride is free (OpenFold3's [B,S,N,H,D] and cuEquivariance's [B,S,H,N,D] both
// work as views). Strides may be 0 to broadcast an input.
#pragma once
#include <cstddef>
#include <optional>

#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct AttentionForwardParams {
  TensorView q, k, v;      // [B,S,H,N,D] bf16 or fp16 (GPU); any float dtype (reference)
  TensorView bias;         // [B,1,H,N,N] q's dtype or fp32; finite (q's dtype: it is added by
                           // the tensor cores, where an infinity gives NaN; -inf: use the mask)
  TensorView mask;         // [B,S,1,1,N] bool, optional
  TensorView out;          // [B,S,H,N,D] q's dtype, written
  TensorView out_residual; // [B,S,H,N,D] q's dtype, written = round(O32 - float(out));
                           //   required when compensate, ignored otherwise
  TensorView lse;          // [B,S,H,N] fp32, written (required on GPU, optional for the
                           //   reference); a fully masked row stores +inf so its P is 0,
                           //   a row that met a NaN stores NaN so its gradients are NaN
  std::optional<double> scale;  // default 1/sqrt(D)
  bool compensate = true;
};

struct AttentionBackwardParams {
  TensorView q, k, v, bias, mask;  // as in the forward
  TensorView out;           // [B,S,H,N,D] the forward's output
  TensorView out_residual;  // [B,S,H,N,D] the forward's residual, used when compensate
  TensorView lse;           // [B,S,H,N] fp32 from the forward (GPU); ignored by the reference
  TensorView dout;          // [B,S,H,N,D] q's dtype
  TensorView dq, dk, dv;    // [B,S,H,N,D] q's dtype, written
  TensorView dbias;         // [B,1,H,N,N] bias's dtype, written; optional (skip its reduction)
  TensorView delta;         // [B,S,H,N] fp32 contiguous, optional: Dlt = <dout, out (+ residual)>
                            //   as the caller computed it (the gate's backward, gate.h), read
                            //   instead of computed; ignored by the reference
  std::optional<double> scale;
  bool compensate = true;   // Dlt = <dO, out + residual> (true) or <dO, out> (false)
};

// Checks every argument; returns the first problem found, naming the argument.
// `for_gpu` adds the constraints of the CUDA kernels (dtypes, head dims, alignment).
Status validate_attention_forward(const AttentionForwardParams& p, bool for_gpu);
Status validate_attention_backward(const AttentionBackwardParams& p, bool for_gpu);

// Bytes of device workspace attention_backward needs for these shapes (0 for the forward).
Status attention_backward_workspace_size(const AttentionBackwardParams& p, size_t* bytes);

// CUDA entry points: all pointers are device pointers; asynchronous on `stream`; no allocation,
// no synchronisation. On a validation failure nothing is launched and nothing is written.
Status attention_forward(const AttentionForwardParams& p, cudaStream_t stream);
Status attention_backward(const AttentionBackwardParams& p, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

// Head dims the CUDA kernels are built for; others must be zero-padded up by the caller.
bool attention_head_dim_supported(int64_t head_dim);

}  // namespace tpf
