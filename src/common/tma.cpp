#include "common/tma.h"

#include <cudaTypedefs.h>

namespace tpf::detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not sticky, but do not leave it for the caller's next check
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

bool tma_tile_ok(const void* ptr, int elem_bytes, const TmaTile& t) {
  if (t.rank < 1 || t.rank > 5 || reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  if ((uint64_t{t.box[0]} * elem_bytes) % 16 != 0) return false;
  for (int i = 0; i < t.rank; ++i) {
    if (t.dims[i] == 0 || t.dims[i] > (uint64_t{1} << 32) || t.box[i] == 0 || t.box[i] > 256) return false;
  }
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.strides[i] % 16 != 0 || t.strides[i] >= (uint64_t{1} << 40) || t.strides[i] == 0) return false;
  }
  return true;
}

bool encode_tma(CUtensorMap* map, const void* ptr, CUtensorMapDataType type, const TmaTile& t,
                CUtensorMapSwizzle swizzle) {
  const int elem_bytes = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2;
  const auto fn = encoder();
  if (fn == nullptr || !tma_tile_ok(ptr, elem_bytes, t)) return false;
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return fn(map, type, static_cast<cuuint32_t>(t.rank), const_cast<void*>(ptr), t.dims, t.strides, t.box,
            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace tpf::detail
