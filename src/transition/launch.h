// Host side of the fused transition kernels: their tensor maps.
#pragma once
#include <cuda.h>  // CUtensorMap (types only)
#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::transition {

// A 2-D tiled map over `rows` rows of `cols` elements (contiguous), with the given box.
bool encode_rows(CUtensorMap* map, const void* p, CUtensorMapDataType type, int elem_bytes, int64_t rows,
                 int64_t cols, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle);
// The weights' maps: W_ab [2H][C] in [64 c][64 rows] boxes, W_o [C][H] in [64 hidden][C]
// boxes, both 128B-swizzled (bf16).
bool encode_weights(CUtensorMap* w_ab, CUtensorMap* w_o, const void* wab, const void* wo, int H);

}  // namespace tpf::transition
