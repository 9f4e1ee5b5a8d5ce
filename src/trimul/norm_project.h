// The inference forward's LayerNorm_in and input projection as one kernel (norm_project.cu).
#pragma once
#include <cuda_runtime.h>

#include "trimul/kernels.h"
#include "trimul/workspace.h"

namespace tpf::trimul {

// x̂ = LayerNorm_in(z) and the projection's a, b and output gate in one pass over z, where it
// applies (an inference workspace, C = Ch = 128, N % 8 == 0, z's rows contiguous); *done false
// elsewhere (nothing launched: the caller runs ln_rows_forward and project).
cudaError_t norm_project(const Problem& p, const Workspace& ws, cudaStream_t s, bool* done);

}  // namespace tpf::trimul
