#include "common/validate.h"

#include <sstream>

namespace tpf::detail {

std::string shape_string(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.rank; ++i) os << (i ? "," : "") << t.shape[i];
  os << "]";
  return os.str();
}

std::string dims_string(std::initializer_list<Dim> dims) {
  std::ostringstream os;
  os << "[";
  int i = 0;
  for (const Dim& d : dims) {
    os << (i++ ? "," : "") << d.name;
    if (d.size >= 0) os << "=" << d.size;
  }
  os << "]";
  return os.str();
}

bool is_float_dtype(DType d) {
  return d == DType::kBF16 || d == DType::kFP16 || d == DType::kFP32 || d == DType::kFP64;
}

Status Checker::fail(const std::string& arg, const std::string& what, StatusCode code) const {
  return Status(code, std::string("tpf.") + op + ": argument '" + arg + "': " + what);
}

Status Checker::present(const char* arg, const TensorView& t) const {
  if (!t.present()) return fail(arg, "is required but its data pointer is null");
  return Status::Ok();
}

Status Checker::shape(const char* arg, const TensorView& t, std::initializer_list<Dim> dims) const {
  TPF_RETURN_IF_ERROR(present(arg, t));
  const int rank = static_cast<int>(dims.size());
  if (t.rank != rank) {
    std::ostringstream os;
    os << "expected rank " << rank << " " << dims_string(dims) << ", got rank " << t.rank << " "
       << shape_string(t);
    return fail(arg, os.str());
  }
  int i = 0;
  for (const Dim& d : dims) {
    if (t.shape[i] < 1 || (d.size >= 0 && t.shape[i] != d.size)) {
      std::ostringstream os;
      os << "expected shape " << dims_string(dims) << ", got " << shape_string(t) << " (dimension "
         << i << ", " << d.name << ")";
      return fail(arg, os.str());
    }
    if (t.stride[i] < 0) {
      std::ostringstream os;
      os << "stride " << t.stride[i] << " of dimension " << i << " (" << d.name
         << ") is negative; strides must be >= 0";
      return fail(arg, os.str());
    }
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
  for (DType d : allowed)
    if (t.dtype == d) return Status::Ok();
  std::string list;
  for (DType d : allowed) list += (list.empty() ? "" : " or ") + std::string(dtype_name(d));
  return fail(arg, "expected dtype " + list + ", got " + dtype_name(t.dtype),
              StatusCode::kInvalidType);
}

Status Checker::unit_last_stride(const char* arg, const TensorView& t) const {
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1) {
    std::ostringstream os;
    os << "the last dimension's stride must be 1, got " << t.stride[t.rank - 1];
    return fail(arg, os.str());
  }
  return Status::Ok();
}

Status Checker::aligned(const char* arg, const TensorView& t, int bytes) const {
  const auto addr = reinterpret_cast<uintptr_t>(t.data);
  if (addr % bytes != 0) {
    std::ostringstream os;
    os << "data pointer must be " << bytes << "-byte aligned, got address 0x" << std::hex << addr;
    return fail(arg, os.str());
  }
  const int64_t elems = bytes / dtype_size(t.dtype);
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % elems != 0) {
      std::ostringstream os;
      os << "stride " << t.stride[i] << " of dimension " << i << " must be a multiple of " << elems
         << " elements (" << bytes << " bytes) for vector loads";
      return fail(arg, os.str());
    }
  }
  return Status::Ok();
}

Status Checker::writable(const char* arg, const TensorView& t) const {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1 && t.stride[i] == 0)
      return fail(arg, "is an output but dimension " + std::to_string(i) +
                           " has stride 0 (broadcast); outputs need distinct elements");
  return Status::Ok();
}

Status Checker::contiguous(const char* arg, const TensorView& t) const {
  if (!t.is_contiguous()) return fail(arg, "must be contiguous (row-major), got other strides");
  return Status::Ok();
}

}  // namespace tpf::detail
