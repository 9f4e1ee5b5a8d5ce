// FP64 CPU reference of every op, forward and backward: the oracle of every test and of
// `tpf check`. Takes the same parameter structs as the CUDA entry points, with host pointers of
// any float dtype; computes in double and rounds once into each output's dtype.
#pragma once
#include "turbopairformer/attention.h"
#include "turbopairformer/gate.h"
#include "turbopairformer/layer_norm.h"
#include "turbopairformer/residual.h"
#include "turbopairformer/swiglu.h"
#include "turbopairformer/gated_linear.h"
#include "turbopairformer/transition.h"
#include "turbopairformer/trimul.h"

namespace tpf::reference {

// Writes out (and out_residual, lse where present). out_residual = round(O - double(out)).
Status attention_forward(const AttentionForwardParams& p);
// Recomputes P exactly; Dlt = <dO, out + residual> (compensate) or <dO, out>; when `out` is
// absent, Dlt uses the exact output. Writes dq, dk, dv and dbias (where present).
Status attention_backward(const AttentionBackwardParams& p);

Status trimul_forward(const TrimulForwardParams& p);
Status trimul_backward(const TrimulBackwardParams& p);

// Recomputes the statistics from x; writes y (mean, rstd where present) / dx, dweight, dbias.
Status layer_norm_forward(const LayerNormForwardParams& p);
Status layer_norm_backward(const LayerNormBackwardParams& p);

// Writes y / dx (and y where present).
Status swiglu_forward(const SwigluParams& p);
Status swiglu_backward(const SwigluParams& p);

// Writes y / dg, d_o (and y where present).
Status sigmoid_gate_forward(const SigmoidGateParams& p);
Status sigmoid_gate_backward(const SigmoidGateParams& p);

// Writes out / du.
Status residual_forward(const ResidualParams& p);
Status residual_backward(const ResidualParams& p);
// The transition in FP64 with no intermediate rounding (out, xhat, mean, rstd where present).
Status transition_forward(const TransitionParams& p);
Status transition_backward(const TransitionBackwardParams& p);
// The gated output projection in FP64 with no intermediate rounding.
Status gated_linear_forward(const GatedLinearParams& p);

}  // namespace tpf::reference
