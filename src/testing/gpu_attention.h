// Runs an AttnProblem on the GPU: copies each host tensor's storage to the device as is (so
// strides and padding are kept), poisons the outputs with NaN bytes, runs the kernels and
// copies the results back into the problem's host tensors.
#pragma once
#include <string>
#include <vector>

#include "testing/attention_problem.h"
#include "testing/device_tensor.h"

namespace tpf::harness {

struct GpuRunOptions {
  bool backward = true;
  bool compensate = true;
  int repeats = 1;  // forward and backward calls; results of all calls must be bitwise identical
  bool dbias = true;  // false: the backward is not asked for dbias (the problem's dbias untouched)
};

struct GpuRunResult {
  Status status;
  bool deterministic = true;  // every repeat gave the same bytes of out, res, lse, dq, dk, dv, dbias
};

GpuRunResult run_attention_gpu(test::AttnProblem& p, const GpuRunOptions& opt);

// Relative RMSE of each output (out, dq, dk, dv, dbias) against an FP64 reference problem, and
// the floor of each.
using AttnErrors = ErrorTable;
AttnErrors attention_errors(const test::AttnProblem& got, const test::AttnProblem& ref,
                            bool backward);

}  // namespace tpf::harness
