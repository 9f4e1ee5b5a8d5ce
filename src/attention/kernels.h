// Host-side launchers of the attention kernels (defined in the .cu files).
#pragma once
#include <cuda_runtime.h>

#include "attention/kernel_args.h"

namespace tpf::attn {

cudaError_t launch_forward(const FwdArgs& a, bool fp16, int head_dim, cudaStream_t stream);
// Dlt = <dO, O (+ R)>, then the key-tile-parallel kernel, then the fixed-order reductions.
cudaError_t launch_backward(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream);

// Slice grouping of the backward for these shapes (a pure function of the shapes).
struct BwdPlan {
  int slice_groups;      // ceil(S / kSlices)
  int query_tiles;       // ceil(N / kBlockQ)
  int key_tiles;         // ceil(N / kBlockK)
  int chunks;            // slice chunks = dbias partials
  int groups_per_chunk;
  int part_rows, part_cols;  // N rounded up to whole key / query tiles (dbias partial rows)
  int dq_chains;             // dQ turn chains (tile_config.h's bwd_dq_chains)
};
BwdPlan plan_backward(const Dims& d, int head_dim);

}  // namespace tpf::attn
