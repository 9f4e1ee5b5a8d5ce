#include "attention/tma_maps.h"

namespace tpf::attn {
namespace {

// A dimension of size 1 is never stepped: any valid stride will do for it.
uint64_t stride_bytes(int64_t dim, int64_t elems, int elem_bytes) {
  return dim == 1 ? uint64_t{16} : static_cast<uint64_t>(elems) * elem_bytes;
}
CUtensorMapDataType type16(bool fp16) { return fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; }

}  // namespace

bool tma_slice_rows(CUtensorMap* map, const Bshnd& x, const Dims& d, int D, bool fp16, int rows) {
  // Rows of 32, 64 or 128 bytes: the swizzle of common/swizzle.cuh's tiles (chunk ^ f(row)) is
  // the hardware's 32-, 64- or 128-byte one. (Rows of 256 bytes would take two boxes.)
  if (D != 16 && D != 32 && D != 64) return false;
  detail::TmaTile t;
  t.rank = 5;
  const int64_t dims[5] = {D, d.N, d.H, d.S, d.B};
  const int64_t strides[4] = {x.sn, x.sh, x.ss, x.sb};
  for (int i = 0; i < 5; ++i) t.dims[i] = static_cast<uint64_t>(dims[i]);
  for (int i = 0; i < 4; ++i) t.strides[i] = stride_bytes(dims[i + 1], strides[i], 2);
  const uint32_t box[5] = {static_cast<uint32_t>(D), static_cast<uint32_t>(rows), 1, 1, 1};
  for (int i = 0; i < 5; ++i) t.box[i] = box[i];
  const CUtensorMapSwizzle swizzle = D == 16   ? CU_TENSOR_MAP_SWIZZLE_32B
                                     : D == 32 ? CU_TENSOR_MAP_SWIZZLE_64B
                                               : CU_TENSOR_MAP_SWIZZLE_128B;
  return detail::encode_tma(map, x.ptr, type16(fp16), t, swizzle);
}

bool tma_bias_tiles(CUtensorMap* map, const BiasRef& bias, const Dims& d, bool fp16, int rows) {
  if (!bias.vec16 || bias.sk != 1) return false;
  const int elem_bytes = bias.fp32 ? 4 : 2;
  detail::TmaTile t;
  t.rank = 4;
  const int64_t dims[4] = {d.N, d.N, d.H, d.B};
  const int64_t strides[3] = {bias.sq, bias.sh, bias.sb};
  for (int i = 0; i < 4; ++i) t.dims[i] = static_cast<uint64_t>(dims[i]);
  for (int i = 0; i < 3; ++i) t.strides[i] = stride_bytes(dims[i + 1], strides[i], elem_bytes);
  const uint32_t box[4] = {static_cast<uint32_t>(128 / elem_bytes), static_cast<uint32_t>(rows), 1, 1};
  for (int i = 0; i < 4; ++i) t.box[i] = box[i];
  const CUtensorMapDataType type = bias.fp32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : type16(fp16);
  return detail::encode_tma(map, bias.ptr, type, t, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace tpf::attn
