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

typedef struct tpf_attention_args {
  tpf_tensor q, k, v, bias, mask, out, out_residual, lse, dout, dq, dk, dv, dbias;
  double scale;       /* NaN: 1/sqrt(D) */
  int32_t compensate; /* output-residual compensation */
} tpf_attention_args;

/* Weights in tpf::TrimulWeights order: norm_in_weight, norm_in_bias, p_in_weight, p_in_bias,
 * g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias,
 * g_out_weight, g_out_bias. */
#define TPF_TRIMUL_WEIGHTS 12
typedef struct tpf_trimul_args {
  tpf_tensor z, mask, out, dout, dz;
  tpf_tensor w[TPF_TRIMUL_WEIGHTS], dw[TPF_TRIMUL_WEIGHTS];
  int32_t direction; /* 0 outgoing, 1 incoming */
  double eps;
  /* Optional training buffer (tpf::TrimulForwardParams::saved): the CUDA forward writes it, the
   * CUDA backward reads it instead of recomputing; NULL: none. The CPU reference ignores it. */
  void* saved;
  size_t saved_bytes;
} tpf_trimul_args;

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
TPF_C_API const char* tpf_version(void);

#ifdef __cplusplus
}
#endif
#endif
