// Fork/join of two independent launch sequences of one call: the side sequence runs on a
// second stream that waits for the caller's stream's work so far (begin) and that the caller's
// stream waits for afterwards (join); CUDA graph capture records the pair as two branches.
// Latency-bound kernels of the two sequences then fill each other's idle issue slots. Results
// do not depend on the interleaving (no kernel of one sequence touches the other's buffers).
//
// The second stream and its two events exist per host thread and device, created on first use
// outside a stream capture; where they do not (first use inside a capture, or creation failed)
// both sequences run in order on the caller's stream.
#pragma once
#include <cuda_runtime.h>

namespace tpf::detail {

class Fork {
 public:
  explicit Fork(cudaStream_t main);
  // The side sequence's stream after begin(): the second stream, or main when there is none.
  cudaStream_t side() const { return side_; }
  cudaError_t begin();
  cudaError_t join();

 private:
  cudaStream_t main_, side_;
  cudaEvent_t forked_ = nullptr, done_ = nullptr;
};

}  // namespace tpf::detail
