// Index maps of the fused backward tail (tail_parts.cuh), host and device, apart from the kernel
// so that a CPU test (tests/cpp/test_trimul_tail_layout.cpp) checks them: its shared-memory tiles
// and which columns a thread's register values belong to.
#pragma once
#include <cstdint>

#include "trimul/layout.h"

// Forced inline in device code (as the kernel's own helpers are), plain inline on the host.
#if defined(__CUDACC__)
#define TPF_TAIL_MAP __host__ __device__ __forceinline__
#else
#define TPF_TAIL_MAP inline
#endif

namespace tpf::trimul::tail {

// Byte offset of 16-byte chunk `ch16` (of 16) of row `row` (of 64) in a [64 rows][128] 16-bit
// K-major tile made of two [64][64] halves in the 128-byte swizzle (TMA's and wgmma's layout).
TPF_TAIL_MAP uint32_t chunk_at(int row, int ch16) {
  return static_cast<uint32_t>((ch16 / 8) * (64 * 128) + row * 128 + (((ch16 % 8) ^ (row % 8)) << 4));
}

// Float index of (channel c, pixel r) in a consumer's da/db tile [64 ch][64 px] (layout.h's
// swizzle: a warp's reads, channels 4i + t and pixels of 8 rows, hit the 32 banks once).
TPF_TAIL_MAP int da_index(int c, int r) { return da_tile_index<64>(c, r); }

// After reduce_scatter_rows over N values, the first of the N / 8 totals lane `lane` keeps.
template <int N>
TPF_TAIL_MAP int scatter_base(int lane) {
  return (lane & 16 ? N / 2 : 0) + (lane & 8 ? N / 4 : 0) + (lane & 4 ? N / 8 : 0);
}

// The column within a 128-column dlin tile of the epilogue's sums index q (8k + 2n + e) of
// thread t: its values of k are dlin columns 32k + 8t .. + 7 (dlin_order.h).
TPF_TAIL_MAP int sums_column(int q, int t) { return 32 * (q / 8) + 8 * t + q % 8; }

// The channel of LayerNorm index idx (2i + e) of thread t: the accumulator's column 8i + 2t + e.
TPF_TAIL_MAP int norm_channel(int idx, int t) { return 8 * (idx / 2) + 2 * t + idx % 2; }

}  // namespace tpf::trimul::tail
