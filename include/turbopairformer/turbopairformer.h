// The whole public C++ API.
#pragma once
#include "turbopairformer/attention.h"
#include "turbopairformer/gate.h"
#include "turbopairformer/gated_linear.h"
#include "turbopairformer/layer_norm.h"
#include "turbopairformer/residual.h"
#include "turbopairformer/swiglu.h"
#include "turbopairformer/reference.h"
#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"
#include "turbopairformer/transition.h"
#include "turbopairformer/trimul.h"

namespace tpf {
const char* version();
// Build facts for `tpf info`: compiler, CUDA version, architectures.
const char* build_info();
// Number of usable CUDA devices (0 without a driver or GPU; never fails).
int cuda_device_count();
}  // namespace tpf
