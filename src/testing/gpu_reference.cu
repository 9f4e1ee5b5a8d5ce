// Naive FP64 kernels: one thread per output row / element, every probability recomputed from
// the exact LSE. Slow by design; only the arithmetic must be exact.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

#include "testing/gpu_reference.h"

namespace tpf::harness {
namespace {

struct Dev {  // dtype-generic element access
  const void* p;
  DType t;
  __device__ double operator[](int64_t i) const {
    switch (t) {
      case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
      case DType::kFP16: return __half2float(static_cast<const __half*>(p)[i]);
      case DType::kFP32: return static_cast<const float*>(p)[i];
      case DType::kFP64: return static_cast<const double*>(p)[i];
      default: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
    }
  }
};

struct Args {
  Dev q, k, v, bias, dout;
  const uint8_t* mask;
  int B, S, H, N, D;
  double scale;
  double *out, *lse, *delta, *dq, *dk, *dv, *dbias;
  __device__ int64_t row(int b, int s, int h, int n) const {
    return ((static_cast<int64_t>(b) * S + s) * H + h) * N + n;
  }
  __device__ bool attend(int b, int s, int k) const {
    return mask == nullptr || mask[(static_cast<int64_t>(b) * S + s) * N + k] != 0;
  }
  __device__ double score(int b, int s, int h, int qn, int kn) const {
    const int64_t qr = row(b, s, h, qn) * D, kr = row(b, s, h, kn) * D;
    double dot = 0.0;
    for (int e = 0; e < D; ++e) dot += q[qr + e] * k[kr + e];
    return scale * dot + bias[((static_cast<int64_t>(b) * H + h) * N + qn) * N + kn];
  }
  __device__ double prob(int b, int s, int h, int qn, int kn) const {
    const double l = lse[row(b, s, h, qn)];
    return attend(b, s, kn) && l < INFINITY ? exp(score(b, s, h, qn, kn) - l) : 0.0;
  }
  __device__ double dprob(int b, int s, int h, int qn, int kn) const {  // dP = dO V^T
    const int64_t qr = row(b, s, h, qn) * D, kr = row(b, s, h, kn) * D;
    double dot = 0.0;
    for (int e = 0; e < D; ++e) dot += dout[qr + e] * v[kr + e];
    return dot;
  }
};

__device__ void decode(const Args& a, int64_t i, int* b, int* s, int* h, int* n) {
  *n = i % a.N;
  *h = (i / a.N) % a.H;
  *s = (i / (static_cast<int64_t>(a.N) * a.H)) % a.S;
  *b = i / (static_cast<int64_t>(a.N) * a.H * a.S);
}

__global__ void forward_rows(Args a) {  // out, lse, delta per (b, s, h, q)
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(a.B) * a.S * a.H * a.N) return;
  int b, s, h, q;
  decode(a, i, &b, &s, &h, &q);
  double m = -INFINITY;
  for (int k = 0; k < a.N; ++k)
    if (a.attend(b, s, k)) m = fmax(m, a.score(b, s, h, q, k));
  double* o = a.out + i * a.D;
  for (int e = 0; e < a.D; ++e) o[e] = 0.0;
  if (m == -INFINITY) {
    a.lse[i] = INFINITY;
    a.delta[i] = 0.0;
    return;
  }
  double sum = 0.0;
  for (int k = 0; k < a.N; ++k) {
    if (!a.attend(b, s, k)) continue;
    const double p = exp(a.score(b, s, h, q, k) - m);
    sum += p;
    const int64_t kr = a.row(b, s, h, k) * a.D;
    for (int e = 0; e < a.D; ++e) o[e] += p * a.v[kr + e];
  }
  double dl = 0.0;
  for (int e = 0; e < a.D; ++e) {
    o[e] /= sum;
    dl += a.dout[i * a.D + e] * o[e];
  }
  a.lse[i] = m + log(sum);
  a.delta[i] = dl;
}

__global__ void dq_rows(Args a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(a.B) * a.S * a.H * a.N) return;
  int b, s, h, q;
  decode(a, i, &b, &s, &h, &q);
  double* dq = a.dq + i * a.D;
  for (int e = 0; e < a.D; ++e) dq[e] = 0.0;
  for (int k = 0; k < a.N; ++k) {
    const double p = a.prob(b, s, h, q, k);
    if (p == 0.0) continue;
    const double ds = p * (a.dprob(b, s, h, q, k) - a.delta[i]);
    const int64_t kr = a.row(b, s, h, k) * a.D;
    for (int e = 0; e < a.D; ++e) dq[e] += a.scale * ds * a.k[kr + e];
  }
}

__global__ void dkdv_rows(Args a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(a.B) * a.S * a.H * a.N) return;
  int b, s, h, k;
  decode(a, i, &b, &s, &h, &k);
  double *dk = a.dk + i * a.D, *dv = a.dv + i * a.D;
  for (int e = 0; e < a.D; ++e) dk[e] = dv[e] = 0.0;
  for (int q = 0; q < a.N; ++q) {
    const double p = a.prob(b, s, h, q, k);
    if (p == 0.0) continue;
    const int64_t qi = a.row(b, s, h, q);
    const double ds = p * (a.dprob(b, s, h, q, k) - a.delta[qi]);
    for (int e = 0; e < a.D; ++e) {
      dk[e] += a.scale * ds * a.q[qi * a.D + e];
      dv[e] += p * a.dout[qi * a.D + e];
    }
  }
}

__global__ void dbias_elems(Args a) {  // sum over slices, per (b, h, q, k)
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(a.B) * a.H * a.N * a.N) return;
  const int k = i % a.N, q = (i / a.N) % a.N, h = (i / (static_cast<int64_t>(a.N) * a.N)) % a.H;
  const int b = i / (static_cast<int64_t>(a.N) * a.N * a.H);
  double sum = 0.0;
  for (int s = 0; s < a.S; ++s) {
    const double p = a.prob(b, s, h, q, k);
    if (p != 0.0) sum += p * (a.dprob(b, s, h, q, k) - a.delta[a.row(b, s, h, q)]);
  }
  a.dbias[i] = sum;
}

__device__ double round_to(DType t, double x) {
  switch (t) {
    case DType::kBF16: return __bfloat162float(__float2bfloat16_rn(static_cast<float>(x)));
    case DType::kFP16: return __half2float(__float2half_rn(static_cast<float>(x)));
    case DType::kFP32: return static_cast<float>(x);
    default: return x;
  }
}

__global__ void rmse_partials(Dev x, const double* ref, DType floor_t, int64_t n, double* part) {
  __shared__ double sh[3][256];
  double e = 0, r = 0, f = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double y = ref[i], d = x[i] - y, fr = round_to(floor_t, y) - y;
    e += d * d;
    r += y * y;
    f += fr * fr;
  }
  sh[0][threadIdx.x] = e;
  sh[1][threadIdx.x] = r;
  sh[2][threadIdx.x] = f;
  __syncthreads();
  for (int w = 128; w > 0; w /= 2) {
    if (threadIdx.x < w)
      for (int c = 0; c < 3; ++c) sh[c][threadIdx.x] += sh[c][threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    for (int c = 0; c < 3; ++c) part[blockIdx.x * 3 + c] = sh[c][0];
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 127) / 128); }

}  // namespace

cudaError_t reference_attention_device(const RefAttnDevice& r, cudaStream_t stream) {
  Args a{{r.q.data, r.q.dtype},       {r.k.data, r.k.dtype},
         {r.v.data, r.v.dtype},       {r.bias.data, r.bias.dtype},
         {r.dout.data, r.dout.dtype}, static_cast<const uint8_t*>(r.mask.data),
         static_cast<int>(r.q.shape[0]), static_cast<int>(r.q.shape[1]),
         static_cast<int>(r.q.shape[2]), static_cast<int>(r.q.shape[3]),
         static_cast<int>(r.q.shape[4]), r.scale, r.out, r.lse, r.delta, r.dq, r.dk, r.dv,
         r.dbias};
  const int64_t rows = static_cast<int64_t>(a.B) * a.S * a.H * a.N;
  forward_rows<<<blocks_for(rows), 128, 0, stream>>>(a);
  dq_rows<<<blocks_for(rows), 128, 0, stream>>>(a);
  dkdv_rows<<<blocks_for(rows), 128, 0, stream>>>(a);
  dbias_elems<<<blocks_for(static_cast<int64_t>(a.B) * a.H * a.N * a.N), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t relative_rmse_device(const TensorView& x, const double* ref, DType floor_dtype,
                                 double* rel_rmse, double* floor) {
  constexpr int kBlocks = 512;
  double* part = nullptr;
  cudaError_t e = cudaMalloc(&part, kBlocks * 3 * sizeof(double));
  if (e != cudaSuccess) return e;
  rmse_partials<<<kBlocks, 256>>>(Dev{x.data, x.dtype}, ref, floor_dtype, x.numel(), part);
  std::vector<double> h(kBlocks * 3);
  e = cudaMemcpy(h.data(), part, h.size() * sizeof(double), cudaMemcpyDeviceToHost);
  cudaFree(part);
  if (e != cudaSuccess) return e;
  double err = 0, ref2 = 0, fl = 0;
  for (int i = 0; i < kBlocks; ++i) {
    err += h[3 * i];
    ref2 += h[3 * i + 1];
    fl += h[3 * i + 2];
  }
  *rel_rmse = ref2 > 0 ? std::sqrt(err / ref2) : std::sqrt(err);
  *floor = ref2 > 0 ? std::sqrt(fl / ref2) : 0.0;
  return cudaSuccess;
}

}  // namespace tpf::harness
