// Runs a TrimulProblem (z, dout bf16; weights bf16 or fp32) on the GPU: outputs, the saved set
// and the workspaces are poisoned, forward then backward `repeats` times; results land in the problem's
// host tensors. Also the FP64 copy of a problem for the reference, and the error table.
#pragma once
#include "testing/device_tensor.h"
#include "testing/gpu_attention.h"
#include "testing/trimul_problem.h"

namespace tpf::harness {

// from_saved: the forward keeps its saved set and every backward call reads it (the training
// path); else the backward recomputes the forward.
GpuRunResult run_trimul_gpu(test::TrimulProblem& p, bool backward, int repeats, bool from_saved = true);

// The same problem with every tensor in FP64 (the reference's input).
test::TrimulProblem trimul_fp64_copy(const test::TrimulProblem& p);

// out, dz and every present weight gradient, against the reference, floors in bf16.
ErrorTable trimul_errors(const test::TrimulProblem& got, const test::TrimulProblem& ref,
                         bool backward);

}  // namespace tpf::harness
