// Residual update and its branch gradient: element-wise over 8 consecutive channels of one
// (b, i, j) row per thread and step; bandwidth-bound, one read of every input and one write of
// the output. The scale is read through its strides (broadcast dims stride 0), as 8 values where
// its channel stride is 1 and as one where it is 0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/dtype_pairs.cuh"
#include "common/mma.cuh"
#include "residual/kernels.h"
#include "residual/rows.cuh"

namespace tpf::residual {
namespace {

constexpr int kThreads = 256;

template <class Tz, class Tu>
__global__ void __launch_bounds__(kThreads) forward_kernel(Shape sh, const Tz* z, const Tu* u, Scale s, Tz* out) {
  const int64_t per_row = sh.C / kVec, n = sh.B * sh.I * sh.J * per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / per_row, c = (i % per_row) * kVec, at = r * sh.C + c;
    float zv[kVec], uv[kVec], sv[kVec];
    load8(zv, z + at);
    load8(uv, u + at);
    load_scale<Tu>(sv, sh, s, r, c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) zv[e] += sv[e] * uv[e];
    store8(out + at, zv);
  }
}

template <class Tz, class Tu>
__global__ void __launch_bounds__(kThreads) backward_kernel(Shape sh, const Tz* dout, Scale s, Tu* du) {
  const int64_t per_row = sh.C / kVec, n = sh.B * sh.I * sh.J * per_row;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / per_row, c = (i % per_row) * kVec, at = r * sh.C + c;
    float g[kVec], sv[kVec];
    load8(g, dout + at);
    load_scale<Tu>(sv, sh, s, r, c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[e] *= sv[e];
    store8(du + at, g);
  }
}

unsigned blocks(const Shape& sh) {
  const int64_t n = sh.B * sh.I * sh.J * (sh.C / kVec), b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 132 * 16 ? b : 132 * 16);  // a grid-stride loop past 16 per SM
}

}  // namespace

cudaError_t forward(const Shape& sh, DType z_dtype, DType u_dtype, const void* z, const void* u, Scale scale,
                    void* out, cudaStream_t st) {
  if (sh.B * sh.I * sh.J * sh.C == 0) return cudaSuccess;
  return dev::with_mixed_pair(z_dtype, u_dtype, [&](auto tz, auto tu) {
    using Tz = decltype(tz);
    using Tu = decltype(tu);
    forward_kernel<Tz, Tu><<<blocks(sh), kThreads, 0, st>>>(sh, static_cast<const Tz*>(z), static_cast<const Tu*>(u),
                                                           scale, static_cast<Tz*>(out));
    return cudaGetLastError();
  });
}

cudaError_t backward(const Shape& sh, DType dout_dtype, DType du_dtype, const void* dout, Scale scale, void* du,
                     cudaStream_t st) {
  if (sh.B * sh.I * sh.J * sh.C == 0) return cudaSuccess;
  return dev::with_mixed_pair(dout_dtype, du_dtype, [&](auto tz, auto tu) {
    using Tz = decltype(tz);
    using Tu = decltype(tu);
    backward_kernel<Tz, Tu>
        <<<blocks(sh), kThreads, 0, st>>>(sh, static_cast<const Tz*>(dout), scale, static_cast<Tu*>(du));
    return cudaGetLastError();
  });
}

}  // namespace tpf::residual
