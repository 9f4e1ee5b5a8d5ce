// Does compute-sanitizer's racecheck follow a shared-memory hand-off ordered by mbarriers? One
// writer warp fills a two-stage ring (the two-pass attention backward's stats loader) and, after
// __syncwarp, its lane 0 arrives on the stage's full barrier; eight reader warps wait on it, read,
// and hand the stage back on its empty barrier. kEveryLane: each thread arrives itself (barrier
// counts 32 and 256) rather than one lane per warp after __syncwarp (counts 1 and 8). Both forms
// are race-free by the PTX ISA's memory model (mbarrier.arrive has release semantics, the
// try_wait that completes has acquire; __syncwarp orders the warp's accesses before lane 0's
// arrive). The printout says which forms racecheck reports.
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo racecheck_mbarrier_handoff.cu
// Run: compute-sanitizer --tool racecheck ./a.out
#include <cstdint>
#include <cstdio>
__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void init(uint32_t bar, uint32_t n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(n) : "memory"); }
__device__ __forceinline__ void arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
template <bool kEveryLane>
__global__ void __launch_bounds__(288, 1) k(float* out, int steps) {
  __shared__ float stage[2][128];             // [stage][value]
  __shared__ alignas(8) uint64_t bars[4];     // full[2], empty[2]
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t full0 = saddr(&bars[0]), empty0 = saddr(&bars[2]);
  if (threadIdx.x == 0)
    for (int s = 0; s < 2; ++s) init(full0 + 8 * s, kEveryLane ? 32 : 1), init(empty0 + 8 * s, kEveryLane ? 256 : 8);
  __syncthreads();
  if (w == 8) {  // the writer warp
    for (int j = 0; j < steps; ++j) {
      wait(empty0 + 8 * (j & 1), ((j / 2) & 1) ^ 1);
      for (int u = 0; u < 4; ++u) stage[j & 1][lane + 32 * u] = j + lane + u;
      if (kEveryLane) arrive(full0 + 8 * (j & 1));
      else { __syncwarp(); if (lane == 0) arrive(full0 + 8 * (j & 1)); }
    }
  } else {  // readers
    float s = 0;
    for (int j = 0; j < steps; ++j) {
      wait(full0 + 8 * (j & 1), (j / 2) & 1);
      s += stage[j & 1][(lane * 4 + w) % 128];
      if (kEveryLane) arrive(empty0 + 8 * (j & 1));
      else { __syncwarp(); if (lane == 0) arrive(empty0 + 8 * (j & 1)); }
    }
    out[threadIdx.x] = s;
  }
}
int main() {
  float* d; cudaMalloc(&d, 288 * 4);
  k<false><<<1, 288>>>(d, 6); printf("one lane a warp after __syncwarp: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  k<true><<<1, 288>>>(d, 6); printf("every lane arrives: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
