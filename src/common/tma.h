// Host side of the Tensor Memory Accelerator (TMA, sm_90): tiled tensor maps of up to 5
// dimensions, encoded by the driver's cuTensorMapEncodeTiled, reached through the runtime's
// entry-point query so that the library needs no link to libcuda.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::detail {

// One tensor map request: dims[0] is the contiguous one (element stride 1); strides[i] is the
// byte stride of dims[i + 1]. box: the tile one copy moves, in elements per dimension.
struct TmaTile {
  int rank = 0;
  uint64_t dims[5] = {};
  uint64_t strides[4] = {};  // bytes
  uint32_t box[5] = {};
};

// Whether `t` meets the hardware's rules for a tiled map over `ptr` with `elem_bytes`-byte
// elements (16-byte aligned base and strides, box rows a multiple of 16 bytes, at most 256 per
// box dimension).
bool tma_tile_ok(const void* ptr, int elem_bytes, const TmaTile& t);

// Encodes `t` over `ptr` (elements of `type`: 16-bit or fp32) with the given shared-memory
// swizzle; out-of-range elements of a box read as zero. Returns false where the driver has no
// encoder, or the map breaks the hardware's rules or is rejected.
bool encode_tma(CUtensorMap* map, const void* ptr, CUtensorMapDataType type, const TmaTile& t,
                CUtensorMapSwizzle swizzle);

}  // namespace tpf::detail
