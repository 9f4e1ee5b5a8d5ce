// Fills device memory with N(0,1) values (or a Bernoulli mask) from a counter-based hash, so
// large benchmark inputs need no host generation or transfer.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "turbopairformer/tensor.h"

namespace tpf::harness {

cudaError_t fill_normal_device(void* data, DType dtype, int64_t count, uint64_t seed,
                               cudaStream_t stream = nullptr);
cudaError_t fill_mask_device(uint8_t* data, int64_t count, double keep, uint64_t seed,
                             cudaStream_t stream = nullptr);

}  // namespace tpf::harness
