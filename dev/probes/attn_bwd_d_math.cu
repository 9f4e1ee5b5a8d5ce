// Design D's math step alone (docs/attention-design.md, "The next backward"): the first
// milestone the design names, math warpgroups with loads and reductions skipped, to hold against
// the ~1.4 ms it predicts at N = 768, D = 32, H = 4, S = N. Not the library: a probe whose tiles
// stay in shared memory (filled once), so the time it reports is the math's alone.
//
// One block: a 128-key tile and 128-query steps; two math warpgroups own 64 keys each, a third
// warpgroup (the producer in D) only gives its registers away. Per step and warpgroup:
//   S^T, dP^T = K Q^T, V dO^T        m64n128k16 x 2 each, both operands from shared memory
//   P^T = exp2((S^T scale + bias^T) log2e - LSE log2e); dS^T = P^T (dP^T - Dlt)
//   dV += P^T dO, dK += dS^T Q       m64n32k16 x 8 each, A from registers (backward_parts.cuh)
//   dS^T -> shared memory (bf16)     then both warpgroups' halves meet at a barrier
//   dQ part = dS K                   m64n32k16 x 8, both operands from shared memory
// Registers: 64 + 64 accumulators for S^T, dP^T, 16 each for dK, dV, dQ, and the 64 bf16 A
// fragments of P^T and dS^T (converted from S^T's and dP^T's registers) under a 240 cap.
//
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I src -o attn_bwd_d_math \
//          dev/probes/attn_bwd_d_math.cu
// Run:   ./attn_bwd_d_math [steps per block = 834]   (834 x 132 blocks x 128 x 128 scores is the
//        1.81e9 of N = 768, D = 32, H = 4, S = N)
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe_timing.cuh"

#include "attention/backward_parts.cuh"
#include "common/mma.cuh"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"

namespace {

namespace dev = tpf::dev;

using T = __nv_bfloat16;
constexpr int D = 32, BK = 128, kMaxBQ = 128;
constexpr int kThreads = 384, kMath = 256;
constexpr float kScale = 0.17677669529663687f, kLog2e = 1.4426950408889634f;

// Shared memory, byte offsets from a 1024-byte aligned base.
// Sized for the largest step (kMaxBQ queries); a 64-query step uses the first half of each.
constexpr uint32_t kK = 0;                        // [BK keys][D] bf16, 64-byte swizzle (tile_at<32>)
constexpr uint32_t kV = kK + BK * D * 2;          // [BK][D]
constexpr uint32_t kQ = kV + BK * D * 2;          // [BQ][D]
constexpr uint32_t kO = kQ + kMaxBQ * D * 2;      // [BQ][D] dO
constexpr uint32_t kDs = kO + kMaxBQ * D * 2;     // dS^T: query halves of [BK][64] bf16, 128-byte swizzle
constexpr uint32_t kBias = kDs + BK * kMaxBQ * 2; // bias^T [BK][kMaxBQ + 8] bf16 (rows padded by 16 bytes)
constexpr int kBiasPitch = kMaxBQ + 8;
constexpr uint32_t kLse = kBias + BK * kBiasPitch * 2;  // [BQ] fp32, LSE log2e
constexpr uint32_t kDlt = kLse + kMaxBQ * 4;            // [BQ] fp32
constexpr uint32_t kDq = kDlt + kMaxBQ * 4;             // [2][BQ][D] fp32, the dQ part(s)
constexpr uint32_t kBytes = kDq + 2 * kMaxBQ * D * 4 + 1024;

__device__ uint32_t hash(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352d, x ^= x >> 15, x *= 0x846ca68b;
  return x ^ (x >> 16);
}

// Small values in every 16-bit tile and the statistics (the swizzle does not matter for them).
__device__ void fill(uint8_t* s) {
  for (uint32_t i = threadIdx.x; i < (kLse - kK) / 2; i += kThreads)
    reinterpret_cast<T*>(s)[i] = __float2bfloat16((hash(i + 17 * blockIdx.x) % 1024) / 1024.f - 0.5f);
  for (uint32_t i = threadIdx.x; i < 2 * kMaxBQ; i += kThreads) reinterpret_cast<float*>(s + kLse)[i] = 1.f;
}

// Byte offset of dS^T element (key, q): query half q / 64, 128-byte rows, chunk (q % 64) / 8
// XOR key % 8 (the 128-byte swizzle the MN-major A descriptor reads).
__device__ __forceinline__ uint32_t ds_at(int key, int q) {
  return kDs + (q / 64) * (BK * 128) + key * 128 + ((((q % 64) / 8) ^ (key % 8)) << 4) + (q % 8) * 2;
}

// S^T (+)= A B over the step's BQ queries: m64n128k16 or m64n64k16.
template <int BQ>
__device__ __forceinline__ void scores(float (&d)[BQ / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (BQ == 128) dev::Wgmma<T, 0, 0>::run(d, a, b, scale_d);
  else dev::WgmmaSS<T, 64, 0, 0>::run(d, a, b, scale_d);
}

// One step of warpgroup wg (keys 64 wg .. 64 wg + 63); dk, dv accumulate over the steps, and so
// does dbias (this thread's BQ / 2 scores) when kDbiasRegs: the tile a slice group would keep on
// chip across its G slices.
template <int BQ, bool kDbiasRegs>
__device__ __forceinline__ void math_step(uint8_t* s, int wg, float (&dk)[16], float (&dv)[16],
                                          float (&dbias)[BQ / 8][4]) {
  constexpr int QT = BQ / 8;
  const int w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t base = dev::smem_addr(s);
  const uint64_t dK = dev::wgmma_desc_rows32(base + kK + wg * 64 * 64), dV = dev::wgmma_desc_rows32(base + kV + wg * 64 * 64);
  const uint64_t dQ = dev::wgmma_desc_rows32(base + kQ), dO = dev::wgmma_desc_rows32(base + kO);
  float sT[QT][4], dpT[QT][4];  // [n8 tile of queries][fragment]: keys 16 w + g (+ 8), queries 8 i + 2 t (+ 1)
  float(&s_flat)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(sT);
  float(&dp_flat)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(dpT);
  dev::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    scores<BQ>(s_flat, dK + 2 * ks, dQ + 2 * ks, ks > 0);
    scores<BQ>(dp_flat, dV + 2 * ks, dO + 2 * ks, ks > 0);
  }
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(s_flat);
  dev::wgmma_fence_operands(dp_flat);

  const float* lse = reinterpret_cast<const float*>(s + kLse);
  const float* dlt = reinterpret_cast<const float*>(s + kDlt);
  const T* biasT = reinterpret_cast<const T*>(s + kBias);
#pragma unroll
  for (int i = 0; i < QT; ++i) {
    const int q = 8 * i + 2 * t;
    const float2 l = *reinterpret_cast<const float2*>(lse + q), d = *reinterpret_cast<const float2*>(dlt + q);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = 64 * wg + 16 * w + g + 8 * r;
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(biasT + key * kBiasPitch + q));
      const float p0 = dev::exp2_approx(fmaf(fmaf(sT[i][2 * r], kScale, b.x), kLog2e, -l.x));
      const float p1 = dev::exp2_approx(fmaf(fmaf(sT[i][2 * r + 1], kScale, b.y), kLog2e, -l.y));
      sT[i][2 * r] = p0, sT[i][2 * r + 1] = p1;
      dpT[i][2 * r] = p0 * (dpT[i][2 * r] - d.x), dpT[i][2 * r + 1] = p1 * (dpT[i][2 * r + 1] - d.y);
      if constexpr (kDbiasRegs) dbias[i][2 * r] += dpT[i][2 * r], dbias[i][2 * r + 1] += dpT[i][2 * r + 1];
    }
  }

  // dV += P^T dO, dK += dS^T Q: the library's part (its wgmma form reads only the descriptors).
  const tpf::attn::StepTiles<T> unused{};
  tpf::attn::gradient_products<T, D, BQ, true>(reinterpret_cast<float(&)[D / 8][4]>(dk),
                                               reinterpret_cast<float(&)[D / 8][4]>(dv), sT, dpT, unused, dQ, dO,
                                               lane);
#pragma unroll
  for (int i = 0; i < QT; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<uint32_t*>(s + ds_at(64 * wg + 16 * w + g + 8 * r, 8 * i + 2 * t)) =
          dev::MmaOp<T>::pack(dpT[i][2 * r], dpT[i][2 * r + 1]);
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(dk);
  dev::wgmma_fence_operands(dv);
  dev::fence_proxy_async();

  // dQ part. 128-query steps: query half wg over all 128 keys (both warpgroups' dS^T rows, so a
  // barrier first and one after). 64-query steps: each warpgroup's partial over its own 64 keys
  // (no barrier; the two partials are summed with the other key tiles'). A = dS MN-major from
  // dS^T, B = K MN-major; a k16 step of keys is 16 rows: + 2048 bytes in A, + 1024 in B.
  constexpr int kKeySteps = BQ == 128 ? BK / 16 : 4;
  const uint32_t a0 = BQ == 128 ? base + kDs + wg * BK * 128 : base + kDs + wg * 64 * 128;
  const uint64_t b0 = dev::wgmma_desc_rows32(base + kK + (BQ == 128 ? 0 : wg * 64 * 64));
  if constexpr (BQ == 128) dev::bar_sync(1, kMath);  // both halves of dS^T written
  float dq[16];
  dev::wgmma_fence();
#pragma unroll
  for (int j = 0; j < kKeySteps; ++j)
    dev::WgmmaSS<T, 32, 1, 1>::run(dq, dev::wgmma_desc(a0 + 2048 * j, BK * 128, 1024), b0 + 64 * j, j > 0);
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(dq);
  float* sdq = reinterpret_cast<float*>(s + kDq) + (BQ == 128 ? 0 : wg * 64 * D);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(sdq + ((BQ == 128 ? 64 * wg : 0) + 16 * w + g + 8 * r) * D + 8 * i + 2 * t) =
          make_float2(dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
  if constexpr (BQ == 128) dev::bar_sync(2, kMath);  // dS^T read by both: the next step may overwrite it
}

template <int BQ, bool kDbiasRegs>
__global__ void __launch_bounds__(kThreads, 1) math_only(int steps, float* out) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* s = smem_raw + ((1024 - (dev::smem_addr(smem_raw) & 1023)) & 1023);
  fill(s);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    dev::regs_decrease<24>();
    return;
  }
  dev::regs_increase<240>();
  float dk[16] = {}, dv[16] = {}, dbias[BQ / 8][4] = {};
  for (int st = 0; st < steps; ++st) math_step<BQ, kDbiasRegs>(s, wg, dk, dv, dbias);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) sum += dk[i] + dv[i];
#pragma unroll
  for (int i = 0; i < BQ / 8; ++i) sum += dbias[i][0] + dbias[i][1] + dbias[i][2] + dbias[i][3];
  out[blockIdx.x * kMath + threadIdx.x] = sum;
}

// Best of 5 timed launches of one variant; steps: 128-query steps per block (halved for
// 64-query steps, twice as many of them).
template <int BQ, bool kDbiasRegs>
float time_variant(int steps, float* out) {
  const int n = steps * (128 / BQ), blocks = 132;
  auto kernel = math_only<BQ, kDbiasRegs>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  const float best = probe::best_of_5_ms([&] { kernel<<<blocks, kThreads, kBytes>>>(1, out); },
                                         [&] { kernel<<<blocks, kThreads, kBytes>>>(n, out); });
  std::printf("%3d-query steps, dbias %s: %d blocks x %d steps: %.3f ms (%s)\n", BQ,
              kDbiasRegs ? "in registers" : "not kept   ", blocks, n, best, cudaGetErrorString(cudaGetLastError()));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 834;
  float* out = nullptr;
  cudaMalloc(&out, 132 * kMath * sizeof(float));
  std::printf("design D's math alone at N = 768, D = 32 (predicted ~1.4 ms; docs/attention-design.md)\n");
  time_variant<128, false>(steps, out);
  time_variant<128, true>(steps, out);
  time_variant<64, false>(steps, out);
  time_variant<64, true>(steps, out);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
