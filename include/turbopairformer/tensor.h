// TensorView: a non-owning description of a strided tensor (pointer, dtype, shape, strides in
// elements). Every public parameter struct is made of these, so one set of checks validates all.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace tpf {

enum class DType : int { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP64 = 3, kBool = 4 };

const char* dtype_name(DType dtype);
int dtype_size(DType dtype);

constexpr int kMaxRank = 6;

struct TensorView {
  void* data = nullptr;  // nullptr marks an absent optional tensor
  DType dtype = DType::kFP32;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements, may be 0 (broadcast) but not negative

  bool present() const { return data != nullptr; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Offset in elements of a multi-index (no bounds checks).
  int64_t offset(std::initializer_list<int64_t> index) const;
};

// A view with row-major (C-contiguous) strides.
TensorView contiguous_view(void* data, DType dtype, std::initializer_list<int64_t> shape);
// A view with explicit strides.
TensorView strided_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> stride);

}  // namespace tpf
