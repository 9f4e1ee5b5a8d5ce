// Argument checks shared by every entry point. Each returns a Status whose message names the
// operation and the argument, says what was expected and what was given.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "turbopairformer/status.h"
#include "turbopairformer/tensor.h"

namespace tpf::detail {

// A dimension expectation: the name printed in messages and the required size (-1 = any).
struct Dim {
  const char* name;
  int64_t size;
};

struct Checker {
  const char* op;  // e.g. "attention_forward"

  Status fail(const std::string& arg, const std::string& what,
              StatusCode code = StatusCode::kInvalidArgument) const;

  // Presence, rank, sizes, non-negative strides, no int64 overflow of the largest offset.
  Status shape(const char* arg, const TensorView& t, std::initializer_list<Dim> dims) const;
  // Dtype is one of `allowed`.
  Status dtype(const char* arg, const TensorView& t, std::initializer_list<DType> allowed) const;
  // Dtype is one of the GPU's `gpu`, or FP64 too where the CPU reference runs (`fp64`).
  Status dtype_or_fp64(const char* arg, const TensorView& t, std::initializer_list<DType> gpu, bool fp64) const;
  Status present(const char* arg, const TensorView& t) const;
  // Last dimension's stride is 1.
  Status unit_last_stride(const char* arg, const TensorView& t) const;
  // Pointer aligned to `bytes` and every stride but the last a multiple of bytes/element size.
  Status aligned(const char* arg, const TensorView& t, int bytes) const;
  // An output: no two elements may share memory (no zero strides on dimensions > 1).
  Status writable(const char* arg, const TensorView& t) const;
  // Row-major contiguous.
  Status contiguous(const char* arg, const TensorView& t) const;
  // A scale broadcast over `like` [B, I, J, C] (a shared dropout mask, a row mask): like's
  // shape through any strides (0 to broadcast), one of `dtypes`; on the GPU the channel stride
  // 0 or 1, and then 16-byte aligned rows.
  Status scale(const char* arg, const TensorView& s, const TensorView& like, std::initializer_list<DType> dtypes,
               bool for_gpu) const;
};

// The (storage, compute) dtype pairs of the element-wise kernels (common/dtype_pairs.cuh): fp32
// with fp32, bf16 or fp16, or both in one 16-bit dtype.
bool mixed_pair(DType a, DType b);

std::string shape_string(const TensorView& t);
std::string dims_string(std::initializer_list<Dim> dims);

}  // namespace tpf::detail
