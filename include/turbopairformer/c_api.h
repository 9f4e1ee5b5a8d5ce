/* A C ABI over the C++ core, for bindings that load the library at run time (the Python package
 * uses ctypes, so one build works with any PyTorch version). Plain structs, status codes of
 * tpf::StatusCode, and a message buffer filled on failure. */
#ifndef TURBOPAIRFORMER_C_API_H
#define TURBOPAIRFORMER_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(TPF_C_API_BUILD)
#define TPF_C_API __attribute__((visibility("default")))
#else
#define TPF_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* dtype: 0 bf16, 1 fp16, 2 fp32, 3 fp64, 4 bool. data == NULL: an absent optional tensor. */
typedef struct tpf_tensor {
  void* data;
  int32_t dtype;
  int32_t rank;
  int64_t shape[6];
  int64_t stride[6]; /* in elements */
} tpf_tensor;

/* The tensors of the attention structs, in their order: the forward's, then the backward's own. */
#define TPF_ATTENTION_FWD_TENSORS(X) X(q) X(k) X(v) X(bias) X(mask) X(out) X(out_residual) X(lse)
#define TPF_ATTENTION_BWD_TENSORS(X) X(dout) X(dq) X(dk) X(dv) X(dbias) X(delta)
#define TPF_ATTENTION_TENSORS(X) TPF_ATTENTION_FWD_TENSORS(X) TPF_ATTENTION_BWD_TENSORS(X)
/* The weights of the multiplicative update, in tpf::TrimulWeights order. */
#define TPF_TRIMUL_WEIGHT_NAMES(X)                                                               \
  X(norm_in_weight) X(norm_in_bias) X(p_in_weight) X(p_in_bias) X(g_in_weight) X(g_in_bias)     \
  X(norm_out_weight) X(norm_out_bias) X(p_out_weight) X(p_out_bias) X(g_out_weight) X(g_out_bias)
#define TPF_TRIMUL_WEIGHTS 12

#define TPF_TENSOR_FIELD_(name) tpf_tensor name;
typedef struct tpf_attention_args {
  TPF_ATTENTION_TENSORS(TPF_TENSOR_FIELD_)
  double scale;       /* NaN: 1/sqrt(D) */
  int32_t compensate; /* output-residual compensation */
} tpf_attention_args;
#undef TPF_TENSOR_FIELD_

typedef struct tpf_trimul_args {
  tpf_tensor z, mask, out, dout, dz;
  tpf_tensor dz_in; /* optional, added to dz (tpf::TrimulBackwardParams::dz_in) */
  /* optional residual update: out = residual + scale * update (tpf::TrimulForwardParams) */
  tpf_tensor residual, scale;
  tpf_tensor w[TPF_TRIMUL_WEIGHTS], dw[TPF_TRIMUL_WEIGHTS];
  int32_t direction; /* 0 outgoing, 1 incoming */
  double eps;
  /* Optional training buffer (tpf::TrimulForwardParams::saved): the CUDA forward writes it, the
   * CUDA backward reads it instead of recomputing; NULL: none. The CPU reference ignores it. */
  void* saved;
  size_t saved_bytes;
} tpf_trimul_args;

/* The tensors of the LayerNorm struct, in order: the forward's, then the backward's own. */
#define TPF_LAYER_NORM_FWD_TENSORS(X) X(x) X(weight) X(bias) X(y) X(mean) X(rstd)
#define TPF_LAYER_NORM_BWD_TENSORS(X) X(dy) X(dx) X(dweight) X(dbias) X(dx_in)
#define TPF_LAYER_NORM_TENSORS(X) TPF_LAYER_NORM_FWD_TENSORS(X) TPF_LAYER_NORM_BWD_TENSORS(X)

#define TPF_TENSOR_FIELD_(name) tpf_tensor name;
typedef struct tpf_layer_norm_args {
  TPF_LAYER_NORM_TENSORS(TPF_TENSOR_FIELD_)
  double eps;
} tpf_layer_norm_args;
#undef TPF_TENSOR_FIELD_

/* SwiGLU (turbopairformer/swiglu.h): x = [a | b], y = silu(a) b. */
typedef struct tpf_swiglu_args {
  tpf_tensor x, y, dy, dx;
} tpf_swiglu_args;

/* The sigmoid gate (turbopairformer/gate.h): y = sigmoid(g) o over [R, W] rows; the backward
 * optionally writes each head's <do, o + out_residual> (delta). */
typedef struct tpf_sigmoid_gate_args {
  tpf_tensor g, o, y, dy, dg, d_o, out_residual, delta;
} tpf_sigmoid_gate_args;

/* The residual update (turbopairformer/residual.h): out = z + scale u; du = dout scale. */
typedef struct tpf_residual_args {
  tpf_tensor z, u, scale, out, dout, du;
} tpf_residual_args;

/* The fused SwiGLU transition forward (turbopairformer/transition.h). */
typedef struct tpf_transition_args {
  tpf_tensor x, ln_w, ln_b, w_ab, w_o, scale, out, xhat, mean, rstd;
  double eps;
  int32_t residual;
} tpf_transition_args;
typedef struct tpf_transition_backward_args {
  tpf_tensor xhat, g, w_ab, w_o, h, dab, dxhat;
} tpf_transition_backward_args;

/* The fused gated output projection (turbopairformer/gated_linear.h): out = x + scale
 * (sigmoid(g) o) W^T + bias. */
typedef struct tpf_gated_linear_args {
  tpf_tensor g, o, w, bias, x, scale, out;
} tpf_gated_linear_args;

/* The layout of the structs above as compiled into the library, for bindings that mirror them
 * (the Python package builds its ctypes structs from this table and checks their layout):
 * one row per field, in order. kind: "tensor", "tensor[12]", "f64", "i32", "ptr", "size", or
 * "struct" (the row of the whole struct: offset 0, size = sizeof). Rows of record
 * "trimul_weight" name the weights in order (offset = index, size 0). */
typedef struct tpf_abi_field {
  const char* record;
  const char* field;
  const char* kind;
  size_t offset;
  size_t size;
} tpf_abi_field;
TPF_C_API const tpf_abi_field* tpf_abi_fields(size_t* count);

/* on_gpu = 0 runs the FP64 CPU reference on host tensors; 1 the CUDA kernels on `stream`. */
TPF_C_API int tpf_attention_forward(const tpf_attention_args* a, int32_t on_gpu, void* stream, char* err,
                          size_t err_len);
TPF_C_API int tpf_attention_backward_workspace_size(const tpf_attention_args* a, size_t* bytes, char* err,
                                          size_t err_len);
TPF_C_API int tpf_attention_backward(const tpf_attention_args* a, int32_t on_gpu, void* workspace,
                           size_t workspace_bytes, void* stream, char* err, size_t err_len);
/* Device workspace bytes of the CUDA forward (backward = 0) or backward (1); 0 for the CPU path. */
TPF_C_API int tpf_trimul_workspace_size(const tpf_trimul_args* a, int32_t backward, size_t* bytes,
                                        char* err, size_t err_len);
/* Bytes of the `saved` buffer for z [B, N, N, C] and hidden width Ch (0 if a size is < 1). */
TPF_C_API size_t tpf_trimul_saved_size(int64_t batch, int64_t n, int64_t c, int64_t c_hidden);
TPF_C_API int tpf_trimul_forward(const tpf_trimul_args* a, int32_t on_gpu, void* workspace,
                                 size_t workspace_bytes, void* stream, char* err, size_t err_len);
TPF_C_API int tpf_trimul_backward(const tpf_trimul_args* a, int32_t on_gpu, void* workspace,
                                  size_t workspace_bytes, void* stream, char* err, size_t err_len);
/* LayerNorm over the last dimension (turbopairformer/layer_norm.h). */
TPF_C_API int tpf_layer_norm_forward(const tpf_layer_norm_args* a, int32_t on_gpu, void* stream, char* err,
                                     size_t err_len);
TPF_C_API int tpf_layer_norm_backward_workspace_size(const tpf_layer_norm_args* a, size_t* bytes, char* err,
                                                     size_t err_len);
TPF_C_API int tpf_layer_norm_backward(const tpf_layer_norm_args* a, int32_t on_gpu, void* workspace,
                                      size_t workspace_bytes, void* stream, char* err, size_t err_len);
TPF_C_API int tpf_swiglu_forward(const tpf_swiglu_args* a, int32_t on_gpu, void* stream, char* err,
                                 size_t err_len);
TPF_C_API int tpf_swiglu_backward(const tpf_swiglu_args* a, int32_t on_gpu, void* stream, char* err,
                                  size_t err_len);
TPF_C_API int tpf_transition_forward(const tpf_transition_args* a, int32_t on_gpu, void* stream, char* err,
                                     size_t err_len);
TPF_C_API int tpf_transition_backward(const tpf_transition_backward_args* a, int32_t on_gpu, void* stream,
                                      char* err, size_t err_len);
TPF_C_API int tpf_gated_linear_forward(const tpf_gated_linear_args* a, int32_t on_gpu, void* stream, char* err,
                                       size_t err_len);
TPF_C_API int tpf_sigmoid_gate_forward(const tpf_sigmoid_gate_args* a, int32_t on_gpu, void* stream, char* err,
                                       size_t err_len);
TPF_C_API int tpf_sigmoid_gate_backward(const tpf_sigmoid_gate_args* a, int32_t on_gpu, void* stream, char* err,
                                        size_t err_len);
TPF_C_API int tpf_residual_forward(const tpf_residual_args* a, int32_t on_gpu, void* stream, char* err,
                                   size_t err_len);
TPF_C_API int tpf_residual_backward(const tpf_residual_args* a, int32_t on_gpu, void* stream, char* err,
                                    size_t err_len);
TPF_C_API const char* tpf_version(void);

#ifdef __cplusplus
}
#endif
#endif
