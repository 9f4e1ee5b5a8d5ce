// Opt-in to more than 48 KB of dynamic shared memory per block for a kernel on the current
// device. The attribute belongs to the (kernel, device) pair, so it is set once per pair and
// remembered: a once-per-process flag would miss a second GPU, and a function-local static in a
// header template is shared by the kernel's copies in different translation units (the second
// copy was launched without the attribute: "invalid argument").
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::detail {

cudaError_t allow_dynamic_smem(const void* kernel, int bytes);

template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel* kernel, int bytes) {
  return allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// The grid of a persistent kernel on the current device: blocks_per_sm blocks a multiprocessor,
// at most one a tile; or the error of the device query.
cudaError_t persistent_grid(int64_t tiles, int blocks_per_sm, unsigned* grid);

}  // namespace tpf::detail
