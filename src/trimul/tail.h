// The fused backward tail (tail.cu): the input projection's backward, d x̂_in and LayerNorm_in's
// backward over pixel rows [r0, r1) in one kernel, writing dlin (for dW_in), dz, and the tiles'
// column-sum and LayerNorm-parameter partials as the three-kernel path does.
#pragma once
#include "trimul/kernels.h"
#include "trimul/workspace.h"

namespace tpf::trimul {

// Whether the tail runs as this kernel: C = 128 (one accumulator holds a row), Ch a multiple of
// 32 up to 128 (whole a/b column tiles, at most TailTile::kMaxColTiles), N % 8 == 0 (da's
// 4-pixel chunks inside a matrix row).
inline bool fused_tail_ok(const Dims& d) {
  return d.C == 128 && d.Ch % 32 == 0 && d.Ch <= 32 * TailTile::kMaxColTiles && d.N % 8 == 0;
}

// Where fused_tail_ok(d); cudaErrorNotSupported where TMA cannot reach an operand
// (the workspace's buffers are all aligned for it).
cudaError_t fused_tail(const Problem& p, const Workspace& ws, int64_t r0, int64_t r1, cudaStream_t s);

}  // namespace tpf::trimul
