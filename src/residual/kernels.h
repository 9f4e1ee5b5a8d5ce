// Host launchers of the residual-update kernels (residual.cu). Each returns the launch error.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "turbopairformer/tensor.h"

namespace tpf::residual {

struct Shape {
  int64_t B, I, J, C;  // C a multiple of 8
};

struct Scale {  // scale[b, i, j, c] at p[b s[0] + i s[1] + j s[2] + c s[3]]; p null: absent
  const void* p;
  int64_t s[4];
};

// A validated scale tensor's pointer and strides (0 on size-1 dimensions, whose stride is any).
inline Scale scale_ref(const TensorView& t) {
  Scale r{t.data, {0, 0, 0, 0}};
  for (int i = 0; t.present() && i < 4; ++i) r.s[i] = t.shape[i] > 1 ? t.stride[i] : 0;
  return r;
}

// out = z + scale u (out may be z).
cudaError_t forward(const Shape& sh, DType z_dtype, DType u_dtype, const void* z, const void* u, Scale scale,
                    void* out, cudaStream_t st);
// du = dout scale, rounded to du_dtype.
cudaError_t backward(const Shape& sh, DType dout_dtype, DType du_dtype, const void* dout, Scale scale, void* du,
                     cudaStream_t st);

}  // namespace tpf::residual
