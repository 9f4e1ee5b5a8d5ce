// Warp specialisation on sm_90a: named barriers between groups of warps, and moving registers
// from a light warpgroup to heavy ones (setmaxnreg).
#pragma once

namespace tpf::dev {

// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a multiple of 32). A
// producer arrives (does not wait) and a consumer syncs; when the barrier completes, memory
// accesses every participant made before it are performed for all of them (PTX ISA, barrier).
// The non-.aligned forms: the roles reach one barrier from different instructions (bar.sync and
// bar.arrive are the .aligned ones, which promise one instruction for the whole CTA).
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Per-thread register budget of the calling warpgroup. The block's pool is what the launch
// allocated (registers per thread x threads), so the decreases must free at least what the
// increases take. ptxas allocates the code after an increase with the larger budget.
template <int kRegs>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace tpf::dev
