#include "transition/launch.h"

#include "common/tma.h"
#include "transition/kernels.h"

namespace tpf::transition {

bool encode_rows(CUtensorMap* map, const void* p, CUtensorMapDataType type, int elem_bytes, int64_t rows,
                 int64_t cols, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  detail::TmaTile t;
  t.rank = 2;
  t.dims[0] = static_cast<uint64_t>(cols), t.dims[1] = static_cast<uint64_t>(rows);
  t.strides[0] = static_cast<uint64_t>(cols) * elem_bytes;
  t.box[0] = box_cols, t.box[1] = box_rows;
  return detail::tma_tile_ok(p, elem_bytes, t) && detail::encode_tma(map, p, type, t, swizzle);
}

bool encode_weights(CUtensorMap* w_ab, CUtensorMap* w_o, const void* wab, const void* wo, int H) {
  constexpr auto kBf16 = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode_rows(w_ab, wab, kBf16, 2, 2 * H, kC, 64, kChunk, CU_TENSOR_MAP_SWIZZLE_128B) &&
         encode_rows(w_o, wo, kBf16, 2, kC, H, 64, kC, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace tpf::transition
