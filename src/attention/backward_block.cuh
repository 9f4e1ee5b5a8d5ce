// The attention backward's shared state (backward.cu): the block's shared-memory regions
// (BwdSmem), the named barriers its roles meet at (BwdBarrier), and what every role reads
// (BwdBlock: the problem, the block's place in it, the shared tiles).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "attention/kernel_args.h"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"

namespace tpf::attn {
namespace {

// Shared memory of one block, in elements; the regions follow one another in this order. C: dQ
// turn chains (tile_config.h's bwd_dq_chains).
template <class BiasT, int D, int C>
struct BwdSmem {
  using Cfg = BwdConfig<D>;
  static constexpr int G = Cfg::kSlices, BK = Cfg::kBlockK, BQ = Cfg::kBlockQ;
  static constexpr int kFStride = BQ + 8;      // fp32 [BK][BQ] rows padded: float2 writes of 8
                                               // rows x 4 lanes hit distinct banks per half-warp
  // 16-bit regions
  static constexpr int kK = 2 * G * BK * D;    // sK    [2][G][BK][D]    swizzled; per slice group,
  static constexpr int kV = 2 * G * BK * D;    // sV    [2][G][BK][D]    double-buffered
  static constexpr int kQ = 2 * G * BQ * D;    // sQ    [2][G][BQ][D]    per step, double-buffered
  static constexpr int kDO = 2 * G * BQ * D;   // sdO   [2][G][BQ][D]
  static constexpr int kDS = G * BK * BQ;      // sdS   [G][BK][BQ]      dS^T, swizzled
  static constexpr int k16 = kK + kV + kQ + kDO + kDS;
  // fp32 regions
  static constexpr int kLse = 2 * G * BQ;      // sLse  [2][G][BQ]       LSE * log2(e)
  static constexpr int kDlt = 2 * G * BQ;      // sDlt  [2][G][BQ]
  static constexpr int kOld = BK * kFStride;   // sOld  [BK][BQ+8]       dbias partial so far
                                               //   (a step ahead; two ahead measured no faster)
  static constexpr int kDSf = G * BK * kFStride;  // sdSf [G][BK][BQ+8]  dS^T, fp32, for dbias
  // sDq [stages][G][BQ][kDqPitch], this key tile's dQ part. Rows of D floats all start on bank 0,
  // so the math's float2 stores (4 rows x 4 lanes a half-warp) conflict 4 ways; 8 floats of padding
  // put the 4 rows 8 banks apart. Only with short chains (C > 1: at N = 768 the padding measured
  // slower, tile_config.h), and only where it fits (not at D = 32 with an fp32 bias).
  static constexpr int kDqRows = Cfg::kDqStages * G * BQ;
  // bias tiles [2] (bias dtype, BiasTile layout)
  static constexpr int kBiasBytes = BiasTile<BiasT, BQ, BK>::kBytes;
  // wgmma reads the 16-bit tiles through swizzle patterns keyed to address bits: the block's
  // base is aligned to the 128-byte swizzle's 1024-byte period (sdS), the rest follow in whole
  // 4 KB tiles.
  static constexpr int kAlign = Cfg::kWgmma ? 1024 : 0;
  static constexpr size_t bytes_with(int dq_pitch) {
    return size_t(k16) * 2 + size_t(kLse + kDlt + kOld + kDSf + kDqRows * dq_pitch) * 4 + 2 * kBiasBytes + kAlign;
  }
  static constexpr int kDqPitch = C > 1 && bytes_with(D + 8) <= 227 * 1024 ? D + 8 : D;
  static constexpr int kDq = kDqRows * kDqPitch;
  static constexpr size_t bytes() { return bytes_with(kDqPitch); }
  static_assert(bytes() <= 227 * 1024, "the H200's shared memory per block");
};

// Named barriers (0, __syncthreads, is not used once the roles split). "+ st": one per stage.
// Each but the first and last hands a buffer between the math warps (all of them) and the helper
// warps of one role (both dbias warps; one dQ warp): the side that hands it over arrives (does
// not wait), the side that takes it syncs.
constexpr int kMaxDqStages = 3;  // (4 do not fit in shared memory at D = 32 with an fp32 bias)
enum BwdBarrier : int {
  kBarTiles = 1,      // the math warps among themselves: a step's tiles landed, the other
                      // stage free for the next step's loads
  kBarDoneB = 2,      // sdSf written (math -> dbias warps)
  kBarDoneQ = 3,      // + stage: sDq[stage] written (math -> the step's dQ warp)
  kBarDqFree = kBarDoneQ + kMaxDqStages,   // + stage: sDq[stage] added (dQ warp -> math)
  kBarDsFree = kBarDqFree + kMaxDqStages,  // sdSf read for dbias (dbias warps -> math)
  kBarQuad = kBarDsFree + 1,               // + quad: a quad's dS^T tile complete (G <= 2)
};
static_assert(kBarQuad + 2 <= 16, "16 named barriers");

// Everything a block's roles share: the problem, its place in it, and the shared tiles.
template <class T, class BiasT, int D, int C>
struct BwdBlock {
  using Cfg = BwdConfig<D>;
  using L = BwdSmem<BiasT, D, C>;
  static constexpr int G = Cfg::kSlices, BK = Cfg::kBlockK, BQ = Cfg::kBlockQ;
  static constexpr int kMath = Cfg::kMathThreads;
  static constexpr int kWith = kMath + 64;      // participants of a math <-> dbias barrier: the
                                                // math and both dbias warps
  static constexpr int kWith1 = kMath + 32;     // of a math <-> dQ warp barrier: one dQ warp
  static constexpr int kVirt = 2;               // a dbias warp takes half of a 128-thread
                                                // geometry: lane + 32 v + 64 half, v < kVirt
  const BwdArgs& a;
  int N, S, H, b, h, kb, k0, n_sg, nq, sg_begin, sg_end, steps;
  T *sK, *sV, *sQ, *sdO, *sdS;
  float *sLse, *sDlt, *sOld, *sdSf, *sDq;
  uint8_t* sBias;
  float* part;  // this block's dbias partial: rows = its BK keys, all Nq (padded) query columns

  __device__ __forceinline__ BwdBlock(const BwdArgs& args, uint8_t* smem) : a(args) {
    N = a.dims.N, S = a.dims.S, H = a.dims.H;
    kb = blockIdx.x, b = blockIdx.z / H, h = blockIdx.z % H, k0 = kb * BK;
    n_sg = (S + G - 1) / G, nq = (N + BQ - 1) / BQ;
    sg_begin = blockIdx.y * a.groups_per_chunk;
    sg_end = min(n_sg, sg_begin + a.groups_per_chunk);
    steps = max(0, sg_end - sg_begin) * nq;
    sK = reinterpret_cast<T*>(smem);
    sV = sK + L::kK;
    sQ = sV + L::kV;
    sdO = sQ + L::kQ;
    sdS = sdO + L::kDO;
    sLse = reinterpret_cast<float*>(sdS + L::kDS);
    sDlt = sLse + L::kLse;
    sOld = sDlt + L::kDlt;
    sdSf = sOld + L::kOld;
    sDq = sdSf + L::kDSf;
    sBias = reinterpret_cast<uint8_t*>(sDq + L::kDq);
    part = a.dbias_part ? a.dbias_part +
                              ((static_cast<int64_t>(blockIdx.y) * a.dims.B + b) * H + h) *
                                  static_cast<int64_t>(a.part_rows) * a.part_cols +
                              static_cast<int64_t>(k0) * a.part_cols
                        : nullptr;
  }
  // Step gs of this block: slice group and query tile.
  __device__ __forceinline__ int group_of(int gs) const { return sg_begin + gs / nq; }
  __device__ __forceinline__ int query_tile_of(int gs) const { return gs % nq; }
  // The slice that quad m reads in group sg (slice 0 if past S: its rows then count as empty).
  __device__ __forceinline__ int slice_of(int sg, int m) const { return sg * G + m < S ? sg * G + m : 0; }
  __device__ __forceinline__ int rows_of(int sg, int m) const { return sg * G + m < S ? N : 0; }
  __device__ __forceinline__ T* k_tile(int sg, int m) const { return sK + (((sg - sg_begin) & 1) * G + m) * BK * D; }
  __device__ __forceinline__ T* v_tile(int sg, int m) const { return sV + (((sg - sg_begin) & 1) * G + m) * BK * D; }
  // This key tile's dQ chain and its place in it; whether it is the chain's last.
  // (C is a template parameter: read from the arguments, the divisor cost the dQ warps' loop its
  // versioning on the first place and the kernel 12%, perf-notes v17.)
  __device__ __forceinline__ int chain() const { return kb % C; }
  __device__ __forceinline__ int chain_pos() const { return kb / C; }
  __device__ __forceinline__ bool chain_last() const { return kb + C >= static_cast<int>(gridDim.x); }
  __device__ __forceinline__ int* turn_of(int sg, int qi) const {
    return a.dq_turn + (((static_cast<int64_t>(chain()) * a.dims.B + b) * H + h) * n_sg + sg) * nq + qi;
  }
};

}  // namespace
}  // namespace tpf::attn
