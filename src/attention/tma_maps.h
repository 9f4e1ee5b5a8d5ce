// TMA tensor maps over the attention tensors (host side), for the D = 16, 32 and 64 forwards,
// which load their tiles by TMA. Each returns false where the tensor's strides or alignment rule
// TMA out (the kernel then loads with cp.async).
#pragma once
#include "attention/kernel_args.h"
#include "common/tma.h"

namespace tpf::attn {

// Tiles of `rows` rows x D of one slice of a [B,S,H,N,D] tensor (16-bit), box (D, rows, 1, 1, 1)
// in the 32-, 64- or 128-byte swizzle (rows of D = 16, 32 or 64 elements), coordinates
// (0, row, h, s, b); false for other D.
bool tma_slice_rows(CUtensorMap* map, const Bshnd& x, const Dims& d, int D, bool fp16, int rows);
// 128-byte x `rows`-query tiles of a bias with key stride 1 (64 keys of a 16-bit bias, 32 of an
// fp32 one), box (keys, rows, 1, 1) in the 128-byte swizzle, coordinates (key, query, h, b).
bool tma_bias_tiles(CUtensorMap* map, const BiasRef& bias, const Dims& d, bool fp16, int rows);

}  // namespace tpf::attn
