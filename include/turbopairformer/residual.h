// The residual update of the pair stack, z' = z + scale * u, and the update's gradient,
// du = dz' * scale: u is a module's update (in the compute dtype), z the residual stream (fp32
// under mixed precision), scale an optional broadcast factor in u's dtype (a dropout mask shared
// along rows or columns, or a row mask broadcast over channels). One pass each way; PyTorch's
// addcmul and mul take these mixed dtypes and broadcasts on their slow, non-vectorised path.
#pragma once
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace tpf {

struct ResidualParams {
  TensorView z;      // forward: [B, I, J, C] contiguous; fp32, bf16 or fp16
  TensorView u;      // forward: z's shape, contiguous; bf16, fp16 or fp32 (GPU: fp32 z, or z's dtype)
  TensorView scale;  // [B, I, J, C] u's dtype, optional (absent: 1); strides free, 0 to broadcast
                     //   (GPU: channel stride 0 or 1)
  TensorView out;    // forward: z's shape and dtype, contiguous, written (may be z itself)
  TensorView dout;   // backward: [B, I, J, C] contiguous, the gradient of out (z's dtype)
  TensorView du;     // backward: dout's shape, contiguous, written, in u's dtype
};

Status validate_residual(const ResidualParams& p, bool backward, bool for_gpu);
// CUDA entry points (C a multiple of 8; 16-byte aligned tensors; nothing allocated).
Status residual_forward(const ResidualParams& p, cudaStream_t stream);
Status residual_backward(const ResidualParams& p, cudaStream_t stream);

}  // namespace tpf
