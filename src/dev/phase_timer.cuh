// Timing experiment only: with -DTPF_EXPERIMENT_PHASES=1 a kernel's loop sums, per warp, the
// cycles spent in each of its phases (mark(i) ends phase i) and prints the per-step averages of
// chosen warps; otherwise every call compiles to nothing. It found the backward's dQ-turn fence
// cost (docs/perf-history.md). The clock reads are volatile, so phases follow program order, but
// arithmetic may move across a mark: read the numbers as approximate.
#pragma once
#ifndef TPF_EXPERIMENT_PHASES
#define TPF_EXPERIMENT_PHASES 0
#endif
#if TPF_EXPERIMENT_PHASES
#include <cstdio>
#endif

namespace tpf::dev {

// kTag tells apart timers of one shape in one kernel (each shape and tag has its own sums).
template <int kWarps, int kPhases, int kTag = 0>
struct PhaseTimer {
  static_assert(kPhases <= 10, "print() shows ten phases");
#if TPF_EXPERIMENT_PHASES
  unsigned long long* sum;  // [kPhases] cycles of this warp
  long long last;
  bool lead;  // lane 0 keeps the warp's sums

  __device__ PhaseTimer(int warp, int lane) : lead(lane == 0) {
    __shared__ unsigned long long sums[kWarps][kPhases];
    sum = sums[warp];
    if (lead)
      for (int i = 0; i < kPhases; ++i) sum[i] = 0;
    last = clock64();
  }
  __device__ void mark(int i) {
    const long long now = clock64();
    if (lead) sum[i] += static_cast<unsigned long long>(now - last);
    last = now;
  }
  // One line: `what`, the block and warp, then each phase's cycles per step.
  __device__ void print(const char* what, int block, int warp, long long steps) const {
    if (!lead || steps <= 0) return;
    unsigned long long v[10] = {};
    for (int i = 0; i < kPhases; ++i) v[i] = sum[i] / static_cast<unsigned long long>(steps);
    printf("phases %s block %d warp %d cycles/step: %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n",
           what, block, warp, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]);
  }
#else
  __device__ __forceinline__ PhaseTimer(int, int) {}
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void print(const char*, int, int, long long) const {}
#endif
};

}  // namespace tpf::dev
