// The dev probes' timing: the best of five CUDA-event-timed calls, after one warm-up call.
#pragma once
#include <cuda_runtime.h>

namespace probe {

// warm_up() once, then launch() five times, each between two events; the fastest, in ms.
template <class WarmUp, class Launch>
float best_of_5_ms(WarmUp warm_up, Launch launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  warm_up();
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    best = ms < best ? ms : best;
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  return best;
}

}  // namespace probe
