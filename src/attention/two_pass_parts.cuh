// The parts both passes of the two-pass attention backward share (two_pass.cu): the ring of
// shared-memory stages and its barriers, the LSE / Dlt loader, and a math warpgroup's scores and
// probabilities over its 64 keys x the step's 128 queries.
//
// Thread (warp w of the warpgroup, g = lane / 4, t = lane % 4) holds keys 16 w + g and
// 16 w + g + 8 of its warpgroup's 64; fragments [16][4]: n8 tile i of the 128 queries, element e
// at key row e / 2, query 8 i + 2 t + e % 2 (the m64n128 accumulator layout).
#pragma once
#include <cuda.h>

#include "attention/tile_config.h"
#include "attention/tile_io.cuh"
#include "common/tma.cuh"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"

namespace tpf::attn {
namespace {

constexpr int kTpD = 32;                          // the head dim the two-pass backward is built for
constexpr uint32_t kTpRows = 128 * kTpD * 2;      // a [128][D] 16-bit tile as TMA lands it (64-byte swizzle)
constexpr uint32_t kTpBiasPart = 128 * 128;       // a [128 queries][64 keys] 16-bit bias box (BiasSwz128)
constexpr uint32_t kTpStats = 2 * 128 * 4;        // LSE log2e and Dlt of 128 queries, fp32

// Tensor maps of the tiles (tma_maps.h): Q, K, V, dO as 128-row boxes of a slice, the bias as
// [128 queries][64 keys] boxes.
struct TwoPassMaps {
  CUtensorMap q, k, v, dout, bias;
};

// Where one step's tiles are: byte offsets from the block's 1024-byte aligned shared base.
struct TpStep {
  uint32_t k, v, q, o, bias, stats;  // stats: LSE log2e [128], then Dlt [128]
};

// The ring's barriers: full[st] completes when the producer's copies have landed and the stats
// loader has written (two arrivals), empty[st] when every math warp has read the stage.
struct TpRing {
  uint32_t bars;  // full[2], then empty[2], 8 bytes each
  __device__ uint32_t full(int st) const { return bars + 8 * st; }
  __device__ uint32_t empty(int st) const { return bars + 16 + 8 * st; }
  __device__ void init() const {
    for (int st = 0; st < 2; ++st) {
      dev::mbar_init(full(st), 2);
      dev::mbar_init(empty(st), TwoPassTile::kMathThreads / 32);
    }
    dev::mbar_init_fence();
  }
  // Step j's stage once the math has released it (a fresh barrier's "previous" phase passes).
  __device__ void acquire(int j) const { dev::mbar_wait(empty(j & 1), ((j / 2) & 1) ^ 1); }
  __device__ void wait_full(int j) const { dev::mbar_wait(full(j & 1), (j / 2) & 1); }
  // A math warp's release of step j's stage (after its last read of it).
  __device__ void release(int j, int lane) const {
    __syncwarp();
    if (lane == 0) dev::mbar_arrive(empty(j & 1));
  }
};

// The block's 1024-byte aligned shared memory (the 128-byte swizzle's period) and its ring, the
// barriers initialised by thread 0 and published to the block.
struct TpShared {
  uint8_t* smem;
  uint32_t base;  // its shared address
  TpRing ring;
};
__device__ __forceinline__ TpShared tp_shared(uint8_t* raw, uint32_t bars) {
  uint8_t* smem = raw + ((1024 - (dev::smem_addr(raw) & 1023)) & 1023);
  const TpShared sh{smem, dev::smem_addr(smem), TpRing{dev::smem_addr(smem) + bars}};
  if (threadIdx.x == 0) sh.ring.init();
  __syncthreads();
  return sh;
}

// The stats loader (one warp): for each step j, LSE log2e and Dlt of the 128 queries from q0 of
// slice row `row` ([B S H] order) into the stage, zero past N (where dO is zero too).
// step_of(j, &row, &q0, &stats): step j's slice row, first query and stage offset.
template <class StepOf>
__device__ void load_stats(const BwdArgs& a, uint8_t* smem, const TpRing& ring, int steps, int lane,
                           const StepOf& step_of) {
  for (int j = 0; j < steps; ++j) {
    int64_t row;
    int q0;
    uint32_t stats;
    step_of(j, &row, &q0, &stats);
    float* lse = reinterpret_cast<float*>(smem + stats);  // [128], then Dlt [128]
    float l[4], d[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // loads first, then the wait: their latency under it
      const int q = q0 + lane + 32 * u;
      const bool in = q < a.dims.N;
      l[u] = in ? a.lse_log2[row * a.dims.N + q] : 0.f;
      d[u] = in ? a.delta[row * a.dims.N + q] : 0.f;
    }
    ring.acquire(j);
#pragma unroll
    for (int u = 0; u < 4; ++u) lse[lane + 32 * u] = l[u], lse[128 + lane + 32 * u] = d[u];
    __syncwarp();
    if (lane == 0) dev::mbar_arrive(ring.full(j & 1));  // release: the warp's stores before it
  }
}

// S^T = K Q^T and dP^T = V dO^T for warpgroup wg's 64 keys (rows 64 wg of the K, V tiles) and the
// 128 queries: m64n128k16, both operands K-major from the 64-byte swizzled tiles.
template <class T>
__device__ __forceinline__ void tp_scores(float (&sT)[16][4], float (&dpT)[16][4], uint32_t base, const TpStep& at,
                                          int wg) {
  float(&s_flat)[64] = reinterpret_cast<float(&)[64]>(sT);
  float(&dp_flat)[64] = reinterpret_cast<float(&)[64]>(dpT);
  const uint64_t dK = dev::wgmma_desc_rows32(base + at.k + wg * 64 * 64), dV = dev::wgmma_desc_rows32(base + at.v + wg * 64 * 64);
  const uint64_t dQ = dev::wgmma_desc_rows32(base + at.q), dO = dev::wgmma_desc_rows32(base + at.o);
  dev::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kTpD / 16; ++ks) {
    dev::Wgmma<T, 0, 0>::run(s_flat, dK + 2 * ks, dQ + 2 * ks, ks > 0);
    dev::Wgmma<T, 0, 0>::run(dp_flat, dV + 2 * ks, dO + 2 * ks, ks > 0);
  }
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(s_flat);
  dev::wgmma_fence_operands(dp_flat);
}

// The score modifier and the probabilities, in place (as backward_parts.cuh's probabilities):
// P^T = exp2((S^T scale + bias) log2(e) - LSE log2(e)), 0 at keys not attended; dS^T = P^T (dP^T
// - Dlt). The bias pairs of two n8 tiles come in one ldmatrix.x4.trans from the warpgroup's
// [128 queries][64 keys] box in the 128-byte swizzle: query row q's chunk c (keys 8c ..) at
// chunk c ^ (q % 8).
template <class T>
__device__ __forceinline__ void tp_probabilities(float (&sT)[16][4], float (&dpT)[16][4], const uint8_t* smem,
                                                 uint32_t base, const TpStep& at, int wg, const bool (&attend)[2],
                                                 float scale) {
  constexpr float kLog2e = 1.4426950408889634f;
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, t = lane % 4;
  const int mx = lane >> 3, j = lane & 7, fr = 16 * w + 8 * (mx & 1), fc = 8 * (mx >> 1);
  const uint32_t bias = base + at.bias + wg * kTpBiasPart + (fc + j) * 128 + (((fr >> 3) ^ j) << 4);
  const float* lse = reinterpret_cast<const float*>(smem + at.stats);
  const float* dlt = lse + 128;
  uint32_t bp[4];  // bias pairs of n8 tiles i, i + 1
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (i % 2 == 0) dev::ldmatrix_x4_trans(bp, bias + 1024 * i);
    const float2 l = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
    const float2 d = *reinterpret_cast<const float2*>(dlt + 8 * i + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const float2 pair = dev::pair_to_float2<T>(bp[2 * (i % 2) + r]);
      const float x = fmaf(fmaf(sT[i][e], scale, e & 1 ? pair.y : pair.x), kLog2e, -(e & 1 ? l.y : l.x));
      // a masked key's exponent is -inf (2^-inf = +0): one select before the exponential, where
      // choosing between the exponential and 0 had the compiler zero all 64 results first
      const float p = dev::exp2_approx(attend[r] ? x : -INFINITY);
      sT[i][e] = p;
      dpT[i][e] = p * (dpT[i][e] - (e & 1 ? d.y : d.x));
    }
  }
}

}  // namespace
}  // namespace tpf::attn
