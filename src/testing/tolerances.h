// Accuracy bounds of the CUDA kernels, as multiples of the floor: the relative RMSE of the
// exact answer rounded once to the activation dtype (~1.66e-3 for bf16). Shared by the GPU
// tests and `tpf check`.
#pragma once

namespace tpf::harness {

// The output is one rounding of an fp32 accumulation.
constexpr double kOutFloorFactor = 1.6;
// Gradients also carry the 16-bit P and dS operands of the tensor-core products.
constexpr double kGradFloorFactor = 3.0;

}  // namespace tpf::harness

namespace tpf::harness {

// Multiplicative update: the output carries the 16-bit roundings of the normalised input, a, b,
// x and LN_out(x) (fp16 where bounded, bf16 otherwise): measured 1.3-1.5x. The gradients also
// carry the bf16 roundings of dy, d xhat, dx, the recomputed a and b, and the projection
// gradients: measured 2.0-2.9x for dz and the weights at N >= 33; LayerNorm and bias gradients
// of tiny problems (N <= 7: sums over a few dozen pixels) reach ~4x.
constexpr double kTrimulOutFloorFactor = 2.0;
constexpr double kTrimulGradFloorFactor = 5.0;

}  // namespace tpf::harness
