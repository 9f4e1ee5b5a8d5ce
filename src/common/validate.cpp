// Messages are built with std::string and std::to_string only: no iostreams, whose locale state
// is not something a library loaded into an arbitrary process (Python, via dlopen) should rely on.
#include "common/validate.h"

#include <cstdio>

namespace tpf::detail {

namespace {
std::string str(int64_t x) { return std::to_string(x); }
}  // namespace

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  // appended piece by piece: GCC 12 misreads `const char* + std::string&&` here (-Wrestrict)
  for (int i = 0; i < t.rank; ++i) {
    if (i) s += ',';
    s += str(t.shape[i]);
  }
  return s + "]";
}

std::string dims_string(std::initializer_list<Dim> dims) {
  std::string s = "[";
  int i = 0;
  for (const Dim& d : dims) {
    if (i++) s += ',';
    s += d.name;
    if (d.size >= 0) {
      s += '=';
      s += str(d.size);
    }
  }
  return s + "]";
}

Status Checker::fail(const std::string& arg, const std::string& what, StatusCode code) const {
  return Status(code, std::string("tpf.") + op + ": argument '" + arg + "': " + what);
}

namespace {
bool is_empty(const TensorView& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return true;
  return false;
}
}  // namespace

Status Checker::present(const char* arg, const TensorView& t) const {
  if (!t.present()) return fail(arg, "is required but its data pointer is null");
  return Status::Ok();
}

Status Checker::shape(const char* arg, const TensorView& t, std::initializer_list<Dim> dims) const {
  const int rank = static_cast<int>(dims.size());
  if (t.rank == rank && is_empty(t))  // before the pointer: an empty tensor's is often null
    return fail(arg, "is empty (shape " + shape_string(t) + "): there is nothing to compute; the "
                     "Python ops return an empty result for it");
  TPF_RETURN_IF_ERROR(present(arg, t));
  if (t.rank != rank)
    return fail(arg, "expected rank " + str(rank) + " " + dims_string(dims) + ", got rank " +
                         str(t.rank) + " " + shape_string(t));
  int i = 0;
  for (const Dim& d : dims) {
    if (t.shape[i] < 1 || (d.size >= 0 && t.shape[i] != d.size))
      return fail(arg, "expected shape " + dims_string(dims) + ", got " + shape_string(t) +
                           " (dimension " + str(i) + ", " + d.name + ")");
    if (t.stride[i] < 0)
      return fail(arg, "stride " + str(t.stride[i]) + " of dimension " + str(i) + " (" + d.name +
                           ") is negative; strides must be >= 0");
    ++i;
  }
  // Largest element offset and element count must fit in int64 (kernels index in 64 bits).
  int64_t max_offset = 0, count = 1;
  for (int j = 0; j < rank; ++j) {
    int64_t term;
    if (__builtin_mul_overflow(t.shape[j] - 1, t.stride[j], &term) ||
        __builtin_add_overflow(max_offset, term, &max_offset) ||
        __builtin_mul_overflow(count, t.shape[j], &count)) {
      return fail(arg, "shape " + shape_string(t) + " with its strides overflows 64-bit indexing");
    }
  }
  int64_t bytes;
  if (__builtin_mul_overflow(count, int64_t{8}, &bytes) ||
      __builtin_mul_overflow(max_offset, int64_t{8}, &bytes)) {
    return fail(arg, "shape " + shape_string(t) + " is too large to address");
  }
  return Status::Ok();
}

Status Checker::dtype(const char* arg, const TensorView& t,
                      std::initializer_list<DType> allowed) const {
  return dtype_or_fp64(arg, t, allowed, false);
}

Status Checker::dtype_or_fp64(const char* arg, const TensorView& t, std::initializer_list<DType> gpu,
                              bool fp64) const {
  if (fp64 && t.dtype == DType::kFP64) return Status::Ok();
  for (DType d : gpu)
    if (t.dtype == d) return Status::Ok();
  std::string list;
  for (DType d : gpu) list += (list.empty() ? "" : " or ") + std::string(dtype_name(d));
  if (fp64) list += " or " + std::string(dtype_name(DType::kFP64));
  return fail(arg, "expected dtype " + list + ", got " + dtype_name(t.dtype),
              StatusCode::kInvalidType);
}

Status Checker::unit_last_stride(const char* arg, const TensorView& t) const {
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
    return fail(arg, "the last dimension's stride must be 1, got " + str(t.stride[t.rank - 1]));
  return Status::Ok();
}

Status Checker::aligned(const char* arg, const TensorView& t, int bytes) const {
  const auto addr = reinterpret_cast<uintptr_t>(t.data);
  if (addr % bytes != 0) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(addr));
    return fail(arg, "data pointer must be " + str(bytes) + "-byte aligned, got address " + hex);
  }
  const int64_t elems = bytes / dtype_size(t.dtype);
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % elems != 0)
      return fail(arg, "stride " + str(t.stride[i]) + " of dimension " + str(i) +
                           " must be a multiple of " + str(elems) + " elements (" + str(bytes) +
                           " bytes) for vector loads");
  }
  return Status::Ok();
}

Status Checker::writable(const char* arg, const TensorView& t) const {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1 && t.stride[i] == 0)
      return fail(arg, "is an output but dimension " + str(i) +
                           " has stride 0 (broadcast); outputs need distinct elements");
  return Status::Ok();
}

Status Checker::contiguous(const char* arg, const TensorView& t) const {
  if (!t.is_contiguous()) return fail(arg, "must be contiguous (row-major), got other strides");
  return Status::Ok();
}

Status Checker::scale(const char* arg, const TensorView& s, const TensorView& like,
                      std::initializer_list<DType> dtypes, bool for_gpu) const {
  TPF_RETURN_IF_ERROR(
      shape(arg, s, {{"B", like.shape[0]}, {"I", like.shape[1]}, {"J", like.shape[2]}, {"C", like.shape[3]}}));
  TPF_RETURN_IF_ERROR(dtype(arg, s, dtypes));
  if (!for_gpu) return Status::Ok();
  const int64_t sc = s.stride[3];
  if (like.shape[3] > 1 && sc != 0 && sc != 1)
    return fail(arg, "channel stride must be 1 or 0 (broadcast) on the GPU, got " + std::to_string(sc),
                StatusCode::kUnsupported);
  return sc == 1 ? aligned(arg, s, 16) : Status::Ok();
}

bool mixed_pair(DType a, DType b) {
  if (a == DType::kFP32) return b == DType::kFP32 || b == DType::kBF16 || b == DType::kFP16;
  return (a == DType::kBF16 || a == DType::kFP16) && b == a;
}

}  // namespace tpf::detail
