// Forward sequence: fold weights, LayerNorm_in, projections + gates, triangle product,
// LayerNorm_out, output projection * gate. fp16 operands (the precision plan in kernels.h). A
// workspace planned with a saved set also writes what the backward needs (stages.cuh).
#include <cuda_fp16.h>

#include "trimul/stages.cuh"

namespace tpf::trimul {

cudaError_t run_forward(const Problem& p, const Workspace& ws, cudaStream_t s) {
  using T = __half;
  const Dims& d = p.d;
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < ws.saved_gaps && e == cudaSuccess; ++i)
    e = cudaMemsetAsync(ws.saved_gap[i].ptr, 0, ws.saved_gap[i].bytes, s);
  if (e != cudaSuccess || (e = forward_through_product<T>(p, ws, s)) != cudaSuccess) return e;
  const OutputEpilogue epi{d, ws.bz, static_cast<const __half*>(ws.gate), p.out, p.res};
  return launch_gemm<T, Major::kK, Major::kK>(pixel_rows(ws.xhat_out, d, d.Ch),
                                              weight_rows(ws.wz, d.C, d.Ch),
                                              {d.M(), static_cast<int>(d.C), d.Ch, 0}, 1, epi, s);
}

}  // namespace tpf::trimul
