// The two-pass triangle attention backward at D = 32 (docs/attention-design.md, "The two-pass
// backward"): where Q, K, V, dO and a 16-bit bias load by TMA, it replaces backward.cu's kernel.
// Both passes recompute each probability tile from the forward's LSE over 128-key x 128-query
// tiles; each keeps its reduction's axis inside the block or in a fixed-order chain, so no fp32
// partial of dbias is read back by the first pass:
// - pass 1 (a block: one 128-key tile of one (b, h), a chunk of slices, every query tile of
//   each): dV += P^T dO and dK += dS^T Q in registers per slice; dQ = dS K per step, whose
//   query halves two dQ warps add to fp32 sums in key-tile order (turn counters, as backward.cu;
//   the adds by bulk copies done at L2);
// - pass 2 (a block: a 128-key x 128-query tile of one (b, h) and a chunk of slices): the
//   dbias tile in registers over the chunk's slices, one fp32 partial a chunk, which reduce.cu's
//   dbias_reduce sums in chunk order.
// Warpgroups 0, 1 are the math (64 keys each); warpgroup 2 loads (thread 0: TMA; warp 1: LSE
// and Dlt) and, in pass 1, sums dQ (warps 2, 3).
#include <cuda_runtime.h>

#include <algorithm>

#include "attention/backward_parts.cuh"
#include "attention/kernels.h"
#include "attention/tma_maps.h"
#include "attention/two_pass_parts.cuh"
#include "common/kernel_attrs.h"

namespace tpf::attn {
namespace {

using TP = TwoPassTile;

// The plan's numbers the kernels read.
struct TpArgs {
  int key_tiles, query_tiles, slices1, slices2;
};

// Pass 1's shared memory (byte offsets from the 1024-byte aligned base).
namespace p1 {
constexpr uint32_t kKv = 0;                       // [2 slices][K, V] [128][D]
constexpr uint32_t kStage0 = 4 * kTpRows;         // [2 stages] of Q, dO, bias [2 parts], stats
constexpr uint32_t kQ = 0, kO = kTpRows, kBias = 2 * kTpRows, kStats = kBias + 2 * kTpBiasPart;
constexpr uint32_t kStageBytes = (kStats + kTpStats + 1023) / 1024 * 1024;
constexpr uint32_t kDs = kStage0 + 2 * kStageBytes;  // dS^T: query halves of [128 keys][64] 16-bit, 128-byte swizzle
constexpr uint32_t kDq = kDs + 128 * 128 * 2;        // [2 step parities][128][D] fp32, the dQ part
constexpr uint32_t kBars = kDq + 2 * 128 * kTpD * 4;
constexpr uint32_t kBytes = kBars + 32 + 1024;
constexpr uint32_t kStepTx = 2 * kTpRows + 2 * kTpBiasPart, kKvTx = 2 * kTpRows;
static_assert(kBytes <= 227 * 1024, "the H200's shared memory per block");
// Named barriers: 1 and 2 among the math; + 2 u + parity: math warpgroup u with dQ warp u.
enum : int { kBarDsWritten = 1, kBarDsRead = 2, kBarDqFull = 3, kBarDqFree = 7 };
constexpr int kHalfWith = 128 + 32;

__device__ __forceinline__ uint32_t stage(int j) { return kStage0 + (j & 1) * kStageBytes; }
__device__ __forceinline__ uint32_t kv(int sl) { return kKv + (sl & 1) * 2 * kTpRows; }
}  // namespace p1

// Pass 2's: a ring of K, V, Q, dO and stats a slice; the block's bias parts once.
namespace p2 {
constexpr uint32_t kK = 0, kV = kTpRows, kQ = 2 * kTpRows, kO = 3 * kTpRows, kStats = 4 * kTpRows;
constexpr uint32_t kStageBytes = (kStats + kTpStats + 1023) / 1024 * 1024;
constexpr uint32_t kBias = 2 * kStageBytes;  // [2 parts] [128 queries][64 keys]
constexpr uint32_t kBars = kBias + 2 * kTpBiasPart;
constexpr uint32_t kBytes = kBars + 32 + 1024;
constexpr uint32_t kStepTx = 4 * kTpRows, kBiasTx = 2 * kTpBiasPart;

__device__ __forceinline__ uint32_t stage(int j) { return (j & 1) * kStageBytes; }
}  // namespace p2

// Byte offset of dS^T element (key, query) in p1::kDs: query half q / 64, 128-byte rows, chunk
// (q % 64) / 8 XOR key % 8 (the 128-byte swizzle the MN-major A descriptor of dS reads).
__device__ __forceinline__ uint32_t ds_at(int key, int q) {
  return p1::kDs + (q / 64) * (128 * 128) + key * 128 + ((((q % 64) / 8) ^ (key % 8)) << 4) + (q % 8) * 2;
}

// The block's place: (b, h), its slices [s0, s1) and their rows of [B S H].
struct TpBlock {
  int b, h, s0, s1;
  __device__ TpBlock(const BwdArgs& a, int slices_per_chunk)
      : b(blockIdx.z / a.dims.H), h(blockIdx.z % a.dims.H), s0(blockIdx.y * slices_per_chunk),
        s1(min(a.dims.S, s0 + slices_per_chunk)) {}
  __device__ int64_t row(const BwdArgs& a, int s) const { return (static_cast<int64_t>(b) * a.dims.S + s) * a.dims.H + h; }
};

// Pass 1's producer: step j = (slice j / nq, query tile j % nq); K, V on a slice's first step.
__device__ void produce1(const TwoPassMaps& m, uint32_t base, const TpRing& ring, const TpBlock& blk, int nq, int k0) {
  for (int j = 0; j < (blk.s1 - blk.s0) * nq; ++j) {
    const int sl = j / nq, s = blk.s0 + sl, q0 = (j % nq) * 128;
    const uint32_t st = base + p1::stage(j), full = ring.full(j & 1);
    ring.acquire(j);
    dev::mbar_arrive_expect_tx(full, p1::kStepTx + (j % nq == 0 ? p1::kKvTx : 0));  // boxes past N count, zero-filled
    if (j % nq == 0) {
      dev::tma_load_5d(base + p1::kv(sl), &m.k, full, 0, k0, blk.h, s, blk.b);
      dev::tma_load_5d(base + p1::kv(sl) + kTpRows, &m.v, full, 0, k0, blk.h, s, blk.b);
    }
    dev::tma_load_5d(st + p1::kQ, &m.q, full, 0, q0, blk.h, s, blk.b);
    dev::tma_load_5d(st + p1::kO, &m.dout, full, 0, q0, blk.h, s, blk.b);
    dev::tma_load_4d(st + p1::kBias, &m.bias, full, k0, q0, blk.h, blk.b);
    dev::tma_load_4d(st + p1::kBias + kTpBiasPart, &m.bias, full, k0 + 64, q0, blk.h, blk.b);
  }
}

// Pass 1's dQ warp of query half u (its lane 0): step j's half of the dQ part (rows 64 u of
// sDq[j & 1], 8 KB) onto the fp32 sum of the key tiles before this one, when its turn counter says
// so, by one bulk copy (the first key tile) or bulk add at L2 (the others); then the turn goes to
// the next key tile. The adds meet each element in key-tile order, as one thread's loop would.
// (The turn counters were zeroed with the workspace.)
__device__ void dq_warp(const BwdArgs& a, uint32_t base, const TpBlock& blk, int nq, int u, int lane) {
  const int kb = blockIdx.x, last = gridDim.x - 1;
  for (int j = 0; j < (blk.s1 - blk.s0) * nq; ++j) {
    const int s = blk.s0 + j / nq, qt = j % nq, p = j & 1, q0 = qt * 128 + 64 * u;
    dev::bar_sync(p1::kBarDqFull + 2 * u + p, p1::kHalfWith);
    int* turn = a.dq_turn + ((static_cast<int64_t>(blockIdx.z) * a.dims.S + s) * nq + qt) * 2 + u;
    if (lane == 0) {
      const uint32_t part = base + p1::kDq + p * 128 * kTpD * 4 + u * 64 * kTpD * 4;
      float* sum = a.dq_acc + (blk.row(a, s) * a.dims.N + q0) * kTpD;
      const uint32_t bytes = static_cast<uint32_t>(max(0, min(64, a.dims.N - q0))) * kTpD * 4;
      if (kb > 0) {
        while (dev::ld_acquire_gpu(turn) != kb) __nanosleep(32);
        dev::fence_proxy_async_global();  // the earlier key tiles' adds, before this one's
      }
      if (bytes > 0) {
        if (kb == 0) dev::bulk_store(sum, part, bytes);
        else dev::bulk_reduce_add_f32(sum, part, bytes);
      }
      dev::bulk_commit();
      dev::bulk_wait_read<0>();  // sDq[p] read
    }
    __syncwarp();
    if (j + 2 < (blk.s1 - blk.s0) * nq) dev::bar_arrive(p1::kBarDqFree + 2 * u + p, p1::kHalfWith);  // none left half-arrived
    if (lane == 0) {
      dev::bulk_wait_all();              // the add performed ...
      dev::fence_proxy_async_global();   // ... and ordered before the release
      if (kb < last) dev::st_release_gpu(turn, kb + 1);
    }
  }
}

// dS^T (the warp's P (dP - Dlt) fragments, keys warp_key0 .. + 15) into p1::kDs as 16-bit values,
// by stmatrix: each x4 stores query columns 8 i .. 8 i + 15 of both 8-key rows, matrix m = lane / 8
// addressed by its lanes (keys + 8 (m % 2), queries + 8 (m / 2)); a matrix row is one 16-byte
// chunk of the swizzled layout, so 8 stores replace 32 four-byte ones and their address math.
template <class T>
__device__ __forceinline__ void store_ds(uint32_t base, const float (&dsT)[16][4], int warp_key0, int lane) {
  const int m = lane / 8, key = warp_key0 + 8 * (m % 2) + lane % 8;
  using Mma = dev::MmaOp<T>;
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    const uint32_t r[4] = {Mma::pack(dsT[i][0], dsT[i][1]), Mma::pack(dsT[i][2], dsT[i][3]),
                           Mma::pack(dsT[i + 1][0], dsT[i + 1][1]), Mma::pack(dsT[i + 1][2], dsT[i + 1][3])};
    dev::stmatrix_x4(base + ds_at(key, 8 * (i + m / 2)), r);
  }
}

// Query half wg of the dQ part, dS (64 queries x 128 keys) K (128 keys x D) on m64n32k16 (A: dS
// MN-major from dS^T, a k16 step of keys + 2048 bytes; B: K MN-major, + 1024), into sDq rows 64 wg.
template <class T>
__device__ __forceinline__ void dq_part(uint8_t* smem, uint32_t base, uint32_t k_tile, uint32_t dq_tile, int wg) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, g = lane / 4, t = lane % 4;
  const uint32_t a0 = base + p1::kDs + wg * 128 * 128;
  const uint64_t b0 = dev::wgmma_desc_rows32(base + k_tile);
  float dq[16];
  dev::wgmma_fence();
#pragma unroll
  for (int j = 0; j < 8; ++j) dev::WgmmaSS<T, 32, 1, 1>::run(dq, dev::wgmma_desc(a0 + 2048 * j, 128 * 128, 1024), b0 + 64 * j, j > 0);
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(dq);
  float* sdq = reinterpret_cast<float*>(smem + dq_tile);  // [128][D]
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(sdq + (64 * wg + 16 * w + g + 8 * r) * kTpD + 8 * i + 2 * t) =
          make_float2(dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
}

// Pass 1's math warpgroup wg: keys k0 + 64 wg .. of every step.
template <class T>
__device__ void math1(const BwdArgs& a, uint8_t* smem, uint32_t base, const TpRing& ring, const TpBlock& blk, int nq,
                      int k0, int wg) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, g = lane / 4, t = lane % 4;
  const int krow[2] = {16 * w + g, 16 * w + g + 8};  // this thread's keys in the warpgroup's 64
  const int kw = k0 + 64 * wg;                       // the warpgroup's first key
  bool attend[2];
  float dk[kTpD / 8][4], dv[kTpD / 8][4];  // 16 keys x D a warp, the slice's
  for (int j = 0; j < (blk.s1 - blk.s0) * nq; ++j) {
    const int sl = j / nq, s = blk.s0 + sl, qt = j % nq, p = j & 1;
    if (qt == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) attend[r] = key_attended(a.mask, blk.b, s, kw + krow[r], a.dims.N);
#pragma unroll
      for (int i = 0; i < kTpD / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    }
    const uint32_t st = p1::stage(j);
    const TpStep at{p1::kv(sl), p1::kv(sl) + kTpRows, st + p1::kQ, st + p1::kO, st + p1::kBias, st + p1::kStats};
    ring.wait_full(j);
    float sT[16][4], dpT[16][4];  // S^T then P^T; dP^T then dS^T
    tp_scores<T>(sT, dpT, base, at, wg);
    tp_probabilities<T>(sT, dpT, smem, base, at, wg, attend, a.scale);
    // dV += P^T dO, dK += dS^T Q (wgmma, Q and dO MN-major: a k16 step of queries is + 64)
    gradient_products<T, kTpD, 128, true>(dk, dv, sT, dpT, StepTiles<T>{}, dev::wgmma_desc_rows32(base + at.q),
                                           dev::wgmma_desc_rows32(base + at.o), lane);
    store_ds<T>(base, dpT, 64 * wg + 16 * w, lane);
    dev::wgmma_wait<0>();
    dev::wgmma_fence_operands(reinterpret_cast<float(&)[kTpD / 2]>(dk));
    dev::wgmma_fence_operands(reinterpret_cast<float(&)[kTpD / 2]>(dv));
    dev::fence_proxy_async();  // dS^T's stores, visible to the dQ wgmma
    dev::bar_sync(p1::kBarDsWritten, TP::kMathThreads);  // both halves of dS^T
    if (j >= 2) dev::bar_sync(p1::kBarDqFree + 2 * wg + p, p1::kHalfWith);  // step j - 2's half added
    dq_part<T>(smem, base, at.k, p1::kDq + p * 128 * kTpD * 4, wg);
    dev::fence_proxy_async();  // the dQ part's stores, visible to the dQ warp's bulk copy
    dev::bar_sync(p1::kBarDsRead, TP::kMathThreads);  // dS^T read by both: the next step rewrites it
    dev::bar_arrive(p1::kBarDqFull + 2 * wg + p, p1::kHalfWith);
    ring.release(j, lane);
    if (qt == nq - 1)
      store_dk_dv<T, kTpD>(slice_ptr_mut<T>(a.dk, blk.b, s, blk.h), a.dk.sn, slice_ptr_mut<T>(a.dv, blk.b, s, blk.h),
                           a.dv.sn, dk, dv, a.scale, kw, a.dims.N, krow, t);
  }
}

template <class T>
__global__ void __launch_bounds__(TP::kThreads, 1) pass1_kernel(const __grid_constant__ TwoPassMaps maps, const BwdArgs a,
                                                                 const TpArgs tp) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const auto [smem, base, ring] = tp_shared(smem_raw, p1::kBars);
  const TpBlock blk(a, tp.slices1);
  const int nq = tp.query_tiles, k0 = blockIdx.x * 128;
  if (blk.s1 <= blk.s0) return;  // every role returns: no barrier is left half-arrived
  if (threadIdx.x >= TP::kMathThreads) {
    dev::regs_decrease<TP::kHelperRegs>();
    const int warp = (threadIdx.x - TP::kMathThreads) / 32, lane = threadIdx.x % 32;
    if (warp == 0 && lane == 0) produce1(maps, base, ring, blk, nq, k0);
    if (warp == 1)
      load_stats(a, smem, ring, (blk.s1 - blk.s0) * nq, lane, [&](int j, int64_t* row, int* q0, uint32_t* stats) {
        *row = blk.row(a, blk.s0 + j / nq), *q0 = (j % nq) * 128, *stats = p1::stage(j) + p1::kStats;
      });
    if (warp >= 2) dq_warp(a, base, blk, nq, warp - 2, lane);
    return;
  }
  dev::regs_increase<TP::kMathRegs>();
  math1<T>(a, smem, base, ring, blk, nq, k0, threadIdx.x / 128);
}

// Pass 2's producer: the bias parts with the first slice, then K, V, Q, dO of each slice.
__device__ void produce2(const TwoPassMaps& m, uint32_t base, const TpRing& ring, const TpBlock& blk, int k0, int q0) {
  for (int j = 0; j < blk.s1 - blk.s0; ++j) {
    const int s = blk.s0 + j;
    const uint32_t st = base + p2::stage(j), full = ring.full(j & 1);
    ring.acquire(j);
    dev::mbar_arrive_expect_tx(full, p2::kStepTx + (j == 0 ? p2::kBiasTx : 0));
    if (j == 0) {
      dev::tma_load_4d(base + p2::kBias, &m.bias, full, k0, q0, blk.h, blk.b);
      dev::tma_load_4d(base + p2::kBias + kTpBiasPart, &m.bias, full, k0 + 64, q0, blk.h, blk.b);
    }
    dev::tma_load_5d(st + p2::kK, &m.k, full, 0, k0, blk.h, s, blk.b);
    dev::tma_load_5d(st + p2::kV, &m.v, full, 0, k0, blk.h, s, blk.b);
    dev::tma_load_5d(st + p2::kQ, &m.q, full, 0, q0, blk.h, s, blk.b);
    dev::tma_load_5d(st + p2::kO, &m.dout, full, 0, q0, blk.h, s, blk.b);
  }
}

// Pass 2's math warpgroup wg: dbias^T of keys k0 + 64 wg .. x queries q0 .., summed over the
// chunk's slices in order, to the chunk's key-major partial (rows and columns padded to 128).
template <class T>
__device__ void math2(const BwdArgs& a, uint8_t* smem, uint32_t base, const TpRing& ring, const TpBlock& blk, int k0,
                      int q0, int wg) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, g = lane / 4, t = lane % 4;
  const int key0 = k0 + 64 * wg + 16 * w + g;  // this thread's keys: key0, key0 + 8
  float acc[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  for (int j = 0; j < blk.s1 - blk.s0; ++j) {
    const int s = blk.s0 + j;
    const bool attend[2] = {key_attended(a.mask, blk.b, s, key0, a.dims.N), key_attended(a.mask, blk.b, s, key0 + 8, a.dims.N)};
    const uint32_t st = p2::stage(j);
    const TpStep at{st + p2::kK, st + p2::kV, st + p2::kQ, st + p2::kO, p2::kBias, st + p2::kStats};
    ring.wait_full(j);
    float sT[16][4], dpT[16][4];
    tp_scores<T>(sT, dpT, base, at, wg);
    tp_probabilities<T>(sT, dpT, smem, base, at, wg, attend, a.scale);
    ring.release(j, lane);
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] += dpT[i][e];  // slice order
  }
  const int64_t plane = static_cast<int64_t>(a.part_rows) * a.part_cols;
  float* part = a.dbias_part + ((static_cast<int64_t>(blockIdx.y) * a.dims.B + blk.b) * a.dims.H + blk.h) * plane;
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(part + static_cast<int64_t>(key0 + 8 * r) * a.part_cols + q0 + 8 * i + 2 * t) =
          make_float2(acc[i][2 * r], acc[i][2 * r + 1]);
}

template <class T>
__global__ void __launch_bounds__(TP::kThreads, 1) pass2_kernel(const __grid_constant__ TwoPassMaps maps, const BwdArgs a,
                                                                 const TpArgs tp) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const auto [smem, base, ring] = tp_shared(smem_raw, p2::kBars);
  const TpBlock blk(a, tp.slices2);
  const int k0 = (blockIdx.x / tp.query_tiles) * 128, q0 = (blockIdx.x % tp.query_tiles) * 128;
  if (blk.s1 <= blk.s0) return;
  if (threadIdx.x >= TP::kMathThreads) {
    dev::regs_decrease<TP::kHelperRegs>();
    const int warp = (threadIdx.x - TP::kMathThreads) / 32, lane = threadIdx.x % 32;
    if (warp == 0 && lane == 0) produce2(maps, base, ring, blk, k0, q0);
    if (warp == 1)
      load_stats(a, smem, ring, blk.s1 - blk.s0, lane, [&](int j, int64_t* row, int* q, uint32_t* stats) {
        *row = blk.row(a, blk.s0 + j), *q = q0, *stats = p2::stage(j) + p2::kStats;
      });
    return;
  }
  dev::regs_increase<TP::kMathRegs>();
  math2<T>(a, smem, base, ring, blk, k0, q0, threadIdx.x / 128);
}

template <class T>
cudaError_t launch_passes(const BwdArgs& a, const TwoPassMaps& maps, const TwoPassPlan& plan, cudaStream_t stream) {
  const TpArgs tp{plan.key_tiles, plan.key_tiles, plan.slices1, plan.slices2};
  const unsigned bh = static_cast<unsigned>(a.dims.B * a.dims.H);
  auto k1 = pass1_kernel<T>;
  if (const cudaError_t e = tpf::detail::allow_dynamic_smem(k1, static_cast<int>(p1::kBytes)); e != cudaSuccess) return e;
  k1<<<dim3(plan.key_tiles, plan.chunks1, bh), TP::kThreads, p1::kBytes, stream>>>(maps, a, tp);
  if (a.dbias_part) {
    auto k2 = pass2_kernel<T>;
    if (const cudaError_t e = tpf::detail::allow_dynamic_smem(k2, static_cast<int>(p2::kBytes)); e != cudaSuccess) return e;
    k2<<<dim3(plan.key_tiles * plan.key_tiles, plan.chunks2, bh), TP::kThreads, p2::kBytes, stream>>>(maps, a, tp);
  }
  return cudaGetLastError();
}

}  // namespace

TwoPassPlan plan_two_pass(const Dims& d) {
  TwoPassPlan p;
  p.key_tiles = (d.N + TP::kBlockK - 1) / TP::kBlockK;
  p.n_pad = p.key_tiles * TP::kBlockK;
  // Chunks of slices, a function of the shapes only (bitwise identical results on any GPU): at
  // least enough for kBwdTargetBlocks blocks (one a multiprocessor at a time), and up to four
  // times as many where that fills the last wave of 132 better, taking the fewest chunks within
  // 2% of the best fill. N = 768, pass 2: 9 chunks (98% of 10 waves) rather than 4 (87% of 5).
  // Each pass-2 chunk is a dbias partial of B H N^2 floats, and the workspace holds the larger
  // of this plan's partials and backward.cu's: beyond the chunks that fill the GPU, pass 2 takes
  // no more than backward.cu's partials hold, so the two-pass backward does not grow it where
  // the partials weigh (N = 512: 10 chunks, 40 MiB, where the best fill took 35, 140 MiB).
  const int64_t bh = static_cast<int64_t>(d.B) * d.H;
  const BwdPlan one = plan_backward(d, kTpD);
  const int64_t plane = int64_t{p.n_pad} * p.n_pad;
  const int64_t cap2 = std::max<int64_t>(1, int64_t{one.chunks} * one.part_rows * one.part_cols / plane);
  auto chunk = [&](int64_t blocks_per_chunk, int64_t cap, int* slices, int* chunks) {
    constexpr int64_t kWave = kBwdTargetBlocks / 4;
    const int64_t want = std::clamp<int64_t>((kBwdTargetBlocks + blocks_per_chunk - 1) / blocks_per_chunk, 1, d.S);
    const int64_t most = std::min<int64_t>(d.S, std::max(want, std::min(cap, 4 * want)));
    auto fill = [&](int64_t c, int* sl, int* n) {  // the last wave's fill with c chunks asked for
      *sl = static_cast<int>((d.S + c - 1) / c), *n = static_cast<int>((d.S + *sl - 1) / *sl);
      const int64_t blocks = blocks_per_chunk * *n;
      return static_cast<double>(blocks) / (((blocks + kWave - 1) / kWave) * kWave);
    };
    double best = 0.0;
    for (int64_t c = want; c <= most; ++c) best = std::max(best, fill(c, slices, chunks));
    for (int64_t c = want; c <= most; ++c)
      if (fill(c, slices, chunks) >= best - 0.02) return;
  };
  chunk(bh * p.key_tiles, d.S, &p.slices1, &p.chunks1);
  chunk(bh * p.key_tiles * p.key_tiles, cap2, &p.slices2, &p.chunks2);
  return p;
}

cudaError_t launch_backward_two_pass(const BwdArgs& args, bool fp16, int head_dim, cudaStream_t stream, bool* launched) {
  *launched = false;
  TwoPassMaps maps;
  const Dims& d = args.dims;
  if (head_dim != kTpD || args.bias.fp32 || !tma_slice_rows(&maps.q, args.q, d, kTpD, fp16, 128) ||
      !tma_slice_rows(&maps.k, args.k, d, kTpD, fp16, 128) || !tma_slice_rows(&maps.v, args.v, d, kTpD, fp16, 128) ||
      !tma_slice_rows(&maps.dout, args.dout, d, kTpD, fp16, 128) || !tma_bias_tiles(&maps.bias, args.bias, d, fp16, 128))
    return cudaSuccess;
  *launched = true;
  const TwoPassPlan plan = plan_two_pass(d);
  BwdArgs a = args;  // the reductions read this plan's dQ chain and dbias partials
  a.dq_chains = 1;
  a.chunks = plan.chunks2;
  a.part_rows = a.part_cols = plan.n_pad;
  cudaError_t e = launch_backward_preprocess(a, fp16, kTpD, stream);
  if (e != cudaSuccess) return e;
  e = fp16 ? launch_passes<__half>(a, maps, plan, stream) : launch_passes<__nv_bfloat16>(a, maps, plan, stream);
  if (e != cudaSuccess) return e;
  return launch_backward_reduce(a, fp16, kTpD, stream);
}

}  // namespace tpf::attn
