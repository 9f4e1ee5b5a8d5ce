// The C ABI: converts plain structs to the C++ parameter structs and Status to codes + text.
#include "turbopairformer/c_api.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <vector>

#include "turbopairformer/turbopairformer.h"

namespace {

tpf::TensorView view(const tpf_tensor& t) {
  tpf::TensorView v;
  v.data = t.data;
  v.dtype = static_cast<tpf::DType>(t.dtype);
  v.rank = t.rank;
  for (int i = 0; i < tpf::kMaxRank; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

int report(const tpf::Status& s, char* err, size_t err_len) {
  if (err && err_len) {
    std::strncpy(err, s.message().c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  return static_cast<int>(s.code());
}

std::optional<double> scale_of(double s) { return std::isnan(s) ? std::nullopt : std::optional<double>(s); }

#define TPF_VIEW_(name) p.name = view(a.name);

tpf::AttentionForwardParams forward_params(const tpf_attention_args& a) {
  tpf::AttentionForwardParams p;
  TPF_ATTENTION_FWD_TENSORS(TPF_VIEW_)
  p.scale = scale_of(a.scale);
  p.compensate = a.compensate != 0;
  return p;
}

tpf::AttentionBackwardParams backward_params(const tpf_attention_args& a) {
  tpf::AttentionBackwardParams p;
  TPF_ATTENTION_FWD_TENSORS(TPF_VIEW_)
  TPF_ATTENTION_BWD_TENSORS(TPF_VIEW_)
  p.scale = scale_of(a.scale);
  p.compensate = a.compensate != 0;
  return p;
}

tpf::LayerNormForwardParams layer_norm_forward_params(const tpf_layer_norm_args& a) {
  tpf::LayerNormForwardParams p;
  TPF_LAYER_NORM_FWD_TENSORS(TPF_VIEW_)
  p.eps = a.eps;
  return p;
}

tpf::LayerNormBackwardParams layer_norm_backward_params(const tpf_layer_norm_args& a) {
  tpf::LayerNormBackwardParams p;
  p.fwd = layer_norm_forward_params(a);
  TPF_LAYER_NORM_BWD_TENSORS(TPF_VIEW_)
  return p;
}

#undef TPF_VIEW_

tpf::SwigluParams swiglu_params(const tpf_swiglu_args& a) { return {view(a.x), view(a.y), view(a.dy), view(a.dx)}; }

tpf::SigmoidGateParams sigmoid_gate_params(const tpf_sigmoid_gate_args& a) {
  return {view(a.g), view(a.o), view(a.y), view(a.dy), view(a.dg), view(a.d_o), view(a.out_residual), view(a.delta)};
}

tpf::ResidualParams residual_params(const tpf_residual_args& a) {
  return {view(a.z), view(a.u), view(a.scale), view(a.out), view(a.dout), view(a.du)};
}

tpf::TransitionParams transition_params(const tpf_transition_args& a) {
  tpf::TransitionParams p;
  p.x = view(a.x), p.ln_w = view(a.ln_w), p.ln_b = view(a.ln_b), p.w_ab = view(a.w_ab), p.w_o = view(a.w_o);
  p.scale = view(a.scale), p.out = view(a.out), p.xhat = view(a.xhat), p.mean = view(a.mean), p.rstd = view(a.rstd);
  p.eps = static_cast<float>(a.eps), p.residual = a.residual != 0;
  return p;
}

tpf::TransitionBackwardParams transition_backward_params(const tpf_transition_backward_args& a) {
  return {view(a.xhat), view(a.g), view(a.w_ab), view(a.w_o), view(a.h), view(a.dab), view(a.dxhat)};
}

tpf::GatedLinearParams gated_linear_params(const tpf_gated_linear_args& a) {
  return {view(a.g), view(a.o), view(a.w), view(a.bias), view(a.x), view(a.scale), view(a.out)};
}

tpf::TrimulWeights trimul_weights(const tpf_tensor* w) {
  tpf::TrimulWeights t;
  int i = 0;
#define TPF_WEIGHT_(name) t.name = view(w[i++]);
  TPF_TRIMUL_WEIGHT_NAMES(TPF_WEIGHT_)
#undef TPF_WEIGHT_
  return t;
}

// tpf_abi_fields' table.
#define TPF_ROW_(rec, name, kind) {#rec, #name, kind, offsetof(rec, name), sizeof(rec::name)},
#define TPF_ATTN_ROW_(name) TPF_ROW_(tpf_attention_args, name, "tensor")
#define TPF_LN_ROW_(name) TPF_ROW_(tpf_layer_norm_args, name, "tensor")
const tpf_abi_field kAbiFields[] = {
    {"tpf_tensor", "", "struct", 0, sizeof(tpf_tensor)},
    TPF_ROW_(tpf_tensor, data, "ptr") TPF_ROW_(tpf_tensor, dtype, "i32") TPF_ROW_(tpf_tensor, rank, "i32")
    TPF_ROW_(tpf_tensor, shape, "i64[6]") TPF_ROW_(tpf_tensor, stride, "i64[6]")
    {"tpf_attention_args", "", "struct", 0, sizeof(tpf_attention_args)},
    TPF_ATTENTION_TENSORS(TPF_ATTN_ROW_)
    TPF_ROW_(tpf_attention_args, scale, "f64") TPF_ROW_(tpf_attention_args, compensate, "i32")
    {"tpf_trimul_args", "", "struct", 0, sizeof(tpf_trimul_args)},
    TPF_ROW_(tpf_trimul_args, z, "tensor") TPF_ROW_(tpf_trimul_args, mask, "tensor")
    TPF_ROW_(tpf_trimul_args, out, "tensor") TPF_ROW_(tpf_trimul_args, dout, "tensor")
    TPF_ROW_(tpf_trimul_args, dz, "tensor") TPF_ROW_(tpf_trimul_args, dz_in, "tensor")
    TPF_ROW_(tpf_trimul_args, residual, "tensor") TPF_ROW_(tpf_trimul_args, scale, "tensor")
    TPF_ROW_(tpf_trimul_args, w, "tensor[12]")
    TPF_ROW_(tpf_trimul_args, dw, "tensor[12]") TPF_ROW_(tpf_trimul_args, direction, "i32")
    TPF_ROW_(tpf_trimul_args, eps, "f64") TPF_ROW_(tpf_trimul_args, saved, "ptr")
    TPF_ROW_(tpf_trimul_args, saved_bytes, "size")
    {"tpf_layer_norm_args", "", "struct", 0, sizeof(tpf_layer_norm_args)},
    TPF_LAYER_NORM_TENSORS(TPF_LN_ROW_)
    TPF_ROW_(tpf_layer_norm_args, eps, "f64")
    {"tpf_swiglu_args", "", "struct", 0, sizeof(tpf_swiglu_args)},
    TPF_ROW_(tpf_swiglu_args, x, "tensor") TPF_ROW_(tpf_swiglu_args, y, "tensor")
    TPF_ROW_(tpf_swiglu_args, dy, "tensor") TPF_ROW_(tpf_swiglu_args, dx, "tensor")
    {"tpf_sigmoid_gate_args", "", "struct", 0, sizeof(tpf_sigmoid_gate_args)},
    TPF_ROW_(tpf_sigmoid_gate_args, g, "tensor") TPF_ROW_(tpf_sigmoid_gate_args, o, "tensor")
    TPF_ROW_(tpf_sigmoid_gate_args, y, "tensor") TPF_ROW_(tpf_sigmoid_gate_args, dy, "tensor")
    TPF_ROW_(tpf_sigmoid_gate_args, dg, "tensor") TPF_ROW_(tpf_sigmoid_gate_args, d_o, "tensor")
    TPF_ROW_(tpf_sigmoid_gate_args, out_residual, "tensor") TPF_ROW_(tpf_sigmoid_gate_args, delta, "tensor")
    {"tpf_residual_args", "", "struct", 0, sizeof(tpf_residual_args)},
    TPF_ROW_(tpf_residual_args, z, "tensor") TPF_ROW_(tpf_residual_args, u, "tensor")
    TPF_ROW_(tpf_residual_args, scale, "tensor") TPF_ROW_(tpf_residual_args, out, "tensor")
    TPF_ROW_(tpf_residual_args, dout, "tensor") TPF_ROW_(tpf_residual_args, du, "tensor")
    {"tpf_transition_args", "", "struct", 0, sizeof(tpf_transition_args)},
    TPF_ROW_(tpf_transition_args, x, "tensor") TPF_ROW_(tpf_transition_args, ln_w, "tensor")
    TPF_ROW_(tpf_transition_args, ln_b, "tensor") TPF_ROW_(tpf_transition_args, w_ab, "tensor")
    TPF_ROW_(tpf_transition_args, w_o, "tensor") TPF_ROW_(tpf_transition_args, scale, "tensor")
    TPF_ROW_(tpf_transition_args, out, "tensor") TPF_ROW_(tpf_transition_args, xhat, "tensor")
    TPF_ROW_(tpf_transition_args, mean, "tensor") TPF_ROW_(tpf_transition_args, rstd, "tensor")
    TPF_ROW_(tpf_transition_args, eps, "f64") TPF_ROW_(tpf_transition_args, residual, "i32")
    {"tpf_transition_backward_args", "", "struct", 0, sizeof(tpf_transition_backward_args)},
    TPF_ROW_(tpf_transition_backward_args, xhat, "tensor") TPF_ROW_(tpf_transition_backward_args, g, "tensor")
    TPF_ROW_(tpf_transition_backward_args, w_ab, "tensor") TPF_ROW_(tpf_transition_backward_args, w_o, "tensor")
    TPF_ROW_(tpf_transition_backward_args, h, "tensor") TPF_ROW_(tpf_transition_backward_args, dab, "tensor")
    TPF_ROW_(tpf_transition_backward_args, dxhat, "tensor")
    {"tpf_gated_linear_args", "", "struct", 0, sizeof(tpf_gated_linear_args)},
    TPF_ROW_(tpf_gated_linear_args, g, "tensor") TPF_ROW_(tpf_gated_linear_args, o, "tensor")
    TPF_ROW_(tpf_gated_linear_args, w, "tensor") TPF_ROW_(tpf_gated_linear_args, bias, "tensor")
    TPF_ROW_(tpf_gated_linear_args, x, "tensor") TPF_ROW_(tpf_gated_linear_args, scale, "tensor")
    TPF_ROW_(tpf_gated_linear_args, out, "tensor")
};
#undef TPF_ROW_
#undef TPF_ATTN_ROW_
#undef TPF_LN_ROW_

#define TPF_NAME_(name) #name,
const char* const kTrimulWeightNames[] = {TPF_TRIMUL_WEIGHT_NAMES(TPF_NAME_)};
#undef TPF_NAME_
static_assert(sizeof(kTrimulWeightNames) / sizeof(kTrimulWeightNames[0]) == TPF_TRIMUL_WEIGHTS);

const std::vector<tpf_abi_field>& abi_fields() {
  static const std::vector<tpf_abi_field> rows = [] {
    std::vector<tpf_abi_field> r(std::begin(kAbiFields), std::end(kAbiFields));
    for (size_t i = 0; i < TPF_TRIMUL_WEIGHTS; ++i)
      r.push_back({"trimul_weight", kTrimulWeightNames[i], "name", i, 0});
    return r;
  }();
  return rows;
}

tpf::TrimulForwardParams trimul_forward_params(const tpf_trimul_args& a) {
  tpf::TrimulForwardParams p;
  p.z = view(a.z);
  p.mask = view(a.mask);
  p.w = trimul_weights(a.w);
  p.direction = static_cast<tpf::TrimulDirection>(a.direction);
  p.eps = a.eps;
  p.out = view(a.out);
  p.residual = view(a.residual);
  p.scale = view(a.scale);
  p.saved = a.saved;
  p.saved_bytes = a.saved_bytes;
  return p;
}

tpf::TrimulBackwardParams trimul_backward_params(const tpf_trimul_args& a) {
  tpf::TrimulBackwardParams p;
  p.fwd = trimul_forward_params(a);
  p.dout = view(a.dout);
  p.dz = view(a.dz);
  p.dz_in = view(a.dz_in);
  p.dw = trimul_weights(a.dw);
  return p;
}

}  // namespace

extern "C" {

int tpf_trimul_workspace_size(const tpf_trimul_args* a, int32_t backward, size_t* bytes, char* err,
                              size_t err_len) {
  return report(backward ? tpf::trimul_backward_workspace_size(trimul_backward_params(*a), bytes)
                         : tpf::trimul_forward_workspace_size(trimul_forward_params(*a), bytes),
                err, err_len);
}

size_t tpf_trimul_saved_size(int64_t batch, int64_t n, int64_t c, int64_t c_hidden) {
  return tpf::trimul_saved_bytes(batch, n, c, c_hidden);
}

int tpf_trimul_forward(const tpf_trimul_args* a, int32_t on_gpu, void* workspace,
                       size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  const auto p = trimul_forward_params(*a);
  return report(on_gpu ? tpf::trimul_forward(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream))
                       : tpf::reference::trimul_forward(p),
                err, err_len);
}

int tpf_trimul_backward(const tpf_trimul_args* a, int32_t on_gpu, void* workspace,
                        size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  const auto p = trimul_backward_params(*a);
  return report(on_gpu ? tpf::trimul_backward(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream))
                       : tpf::reference::trimul_backward(p),
                err, err_len);
}

int tpf_attention_forward(const tpf_attention_args* a, int32_t on_gpu, void* stream, char* err,
                          size_t err_len) {
  const auto p = forward_params(*a);
  return report(on_gpu ? tpf::attention_forward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::attention_forward(p),
                err, err_len);
}

int tpf_attention_backward_workspace_size(const tpf_attention_args* a, size_t* bytes, char* err,
                                          size_t err_len) {
  return report(tpf::attention_backward_workspace_size(backward_params(*a), bytes), err, err_len);
}

int tpf_attention_backward(const tpf_attention_args* a, int32_t on_gpu, void* workspace,
                           size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  const auto p = backward_params(*a);
  return report(on_gpu ? tpf::attention_backward(p, workspace, workspace_bytes,
                                                 static_cast<cudaStream_t>(stream))
                       : tpf::reference::attention_backward(p),
                err, err_len);
}

int tpf_layer_norm_forward(const tpf_layer_norm_args* a, int32_t on_gpu, void* stream, char* err,
                           size_t err_len) {
  const auto p = layer_norm_forward_params(*a);
  return report(on_gpu ? tpf::layer_norm_forward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::layer_norm_forward(p),
                err, err_len);
}

int tpf_layer_norm_backward_workspace_size(const tpf_layer_norm_args* a, size_t* bytes, char* err,
                                           size_t err_len) {
  return report(tpf::layer_norm_backward_workspace_size(layer_norm_backward_params(*a), bytes), err, err_len);
}

int tpf_layer_norm_backward(const tpf_layer_norm_args* a, int32_t on_gpu, void* workspace,
                            size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  const auto p = layer_norm_backward_params(*a);
  return report(on_gpu ? tpf::layer_norm_backward(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream))
                       : tpf::reference::layer_norm_backward(p),
                err, err_len);
}

int tpf_swiglu_forward(const tpf_swiglu_args* a, int32_t on_gpu, void* stream, char* err, size_t err_len) {
  const auto p = swiglu_params(*a);
  return report(on_gpu ? tpf::swiglu_forward(p, static_cast<cudaStream_t>(stream)) : tpf::reference::swiglu_forward(p),
                err, err_len);
}

int tpf_swiglu_backward(const tpf_swiglu_args* a, int32_t on_gpu, void* stream, char* err, size_t err_len) {
  const auto p = swiglu_params(*a);
  return report(on_gpu ? tpf::swiglu_backward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::swiglu_backward(p),
                err, err_len);
}

int tpf_transition_forward(const tpf_transition_args* a, int32_t on_gpu, void* stream, char* err, size_t err_len) {
  const auto p = transition_params(*a);
  return report(on_gpu ? tpf::transition_forward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::transition_forward(p),
                err, err_len);
}

int tpf_transition_backward(const tpf_transition_backward_args* a, int32_t on_gpu, void* stream, char* err,
                            size_t err_len) {
  const auto p = transition_backward_params(*a);
  return report(on_gpu ? tpf::transition_backward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::transition_backward(p),
                err, err_len);
}

int tpf_gated_linear_forward(const tpf_gated_linear_args* a, int32_t on_gpu, void* stream, char* err,
                             size_t err_len) {
  const auto p = gated_linear_params(*a);
  return report(on_gpu ? tpf::gated_linear_forward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::gated_linear_forward(p),
                err, err_len);
}

int tpf_sigmoid_gate_forward(const tpf_sigmoid_gate_args* a, int32_t on_gpu, void* stream, char* err,
                             size_t err_len) {
  const auto p = sigmoid_gate_params(*a);
  return report(on_gpu ? tpf::sigmoid_gate_forward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::sigmoid_gate_forward(p),
                err, err_len);
}

int tpf_sigmoid_gate_backward(const tpf_sigmoid_gate_args* a, int32_t on_gpu, void* stream, char* err,
                              size_t err_len) {
  const auto p = sigmoid_gate_params(*a);
  return report(on_gpu ? tpf::sigmoid_gate_backward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::sigmoid_gate_backward(p),
                err, err_len);
}

int tpf_residual_forward(const tpf_residual_args* a, int32_t on_gpu, void* stream, char* err, size_t err_len) {
  const auto p = residual_params(*a);
  return report(on_gpu ? tpf::residual_forward(p, static_cast<cudaStream_t>(stream)) : tpf::reference::residual_forward(p),
                err, err_len);
}

int tpf_residual_backward(const tpf_residual_args* a, int32_t on_gpu, void* stream, char* err, size_t err_len) {
  const auto p = residual_params(*a);
  return report(on_gpu ? tpf::residual_backward(p, static_cast<cudaStream_t>(stream))
                       : tpf::reference::residual_backward(p),
                err, err_len);
}

const char* tpf_version(void) { return tpf::version(); }

const tpf_abi_field* tpf_abi_fields(size_t* count) {
  if (count) *count = abi_fields().size();
  return abi_fields().data();
}

}  // extern "C"
