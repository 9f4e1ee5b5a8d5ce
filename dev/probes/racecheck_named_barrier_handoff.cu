// Does compute-sanitizer's racecheck follow a named-barrier hand-off between warps that reach
// the barrier from different code? 8 writer warps fill a buffer and arrive on barrier 10; one
// reader warp syncs on it, reads, and hands the buffer back on barrier 9 (arrive, or sync); the
// writers sync on 9 before the next write. The program is race-free by the PTX ISA's barrier
// rules, in all four forms (bar.* / barrier.*, arrive / sync for the hand-back), yet racecheck
// (CUDA 13.0, H200) reports a write/read hazard on the buffer for each of them. The attention
// backward's helper warps use this hand-off; racecheck reports it there the same way
// (a1d0f33:bench/results/h200/v12_iter/racecheck_v12a.txt). Build: nvcc -gencode=arch=compute_90a,code=sm_90a
// -lineinfo racecheck_named_barrier_handoff.cu; run: compute-sanitizer --tool racecheck ./a.out
#include <cstdio>
template <bool A> __device__ __forceinline__ void bsync(int id, int n) {
  if (A) asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
  else asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
template <bool A> __device__ __forceinline__ void barrive(int id, int n) {
  if (A) asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
  else asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
template <bool kAligned, bool kSyncFree>
__global__ void __launch_bounds__(384, 1) k(float* out, int steps) {
  __shared__ float buf[256];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (w < 8) {
    for (int gs = 0; gs < steps; ++gs) {
      if (gs > 0) bsync<kAligned>(9, 288);
      buf[threadIdx.x] = threadIdx.x + gs;
      barrive<kAligned>(10, 288);
    }
  } else {
    if (w != 9) return;
    float s = 0;
    for (int gs = 0; gs < steps; ++gs) {
      bsync<kAligned>(10, 288);
      for (int i = lane; i < 256; i += 32) s += buf[i];
      if (gs + 1 < steps) { if (kSyncFree) bsync<kAligned>(9, 288); else barrive<kAligned>(9, 288); }
    }
    out[lane] = s;
  }
}
int main() {
  float* d; cudaMalloc(&d, 32 * 4);
  k<true, false><<<1, 384>>>(d, 3); printf("aligned arrive: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  k<true, true><<<1, 384>>>(d, 3); printf("aligned sync: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  k<false, false><<<1, 384>>>(d, 3); printf("nonaligned arrive: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  k<false, true><<<1, 384>>>(d, 3); printf("nonaligned sync: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
