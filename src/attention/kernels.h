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

// The backward's parts around its kernels (reduce.cu): Dlt and LSE log2(e) before; dQ's final
// sum and dbias's chunk sum after, from the plan's numbers in `a` (dq_chains, chunks, part_rows,
// part_cols).
cudaError_t launch_backward_preprocess(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream);
cudaError_t launch_backward_reduce(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream);

// The two-pass backward (two_pass.cu): D = 32 with a 16-bit bias, where Q, K, V, dO and the bias
// load by TMA. Its plan is a function of the shapes only.
struct TwoPassPlan {
  int key_tiles;          // ceil(N / 128), also the query tiles
  int n_pad;              // N rounded up to 128: the dbias partials' rows and columns
  int chunks1, slices1;   // pass 1 (dQ, dK, dV): slice chunks, slices a chunk
  int chunks2, slices2;   // pass 2 (dbias): slice chunks = dbias partials, slices a chunk
};
TwoPassPlan plan_two_pass(const Dims& d);
// Runs the whole backward (Dlt, both passes, the reductions) where it applies; *launched says
// whether it did (else nothing was launched).
cudaError_t launch_backward_two_pass(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream, bool* launched);

}  // namespace tpf::attn
