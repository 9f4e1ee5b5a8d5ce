// Triangle attention backward, key-tile parallel (docs/DESIGN.md section 1).
//
// A block owns one 64-key tile of one (b, h) and one chunk of slices. Its math quads of 4 warps
// take BwdConfig::kSlices consecutive slices side by side and walk all query tiles; each
// probability tile P is recomputed once (from the forward's LSE) and feeds all four gradients:
//   dV += P^T dO, dK += dS^T Q (registers, per slice), dQ += dS K, dbias += sum_s dS.
// The math warps also issue each step's tile loads a step ahead. A helper warpgroup does the
// rest, so the math warps only wait for tiles and buffers:
// - two dbias warps sum the quads' dS tiles in quad order onto the block's private fp32 partial
//   of its slice chunk (the chunks are summed in order later);
// - two dQ warps, taking alternate steps, add each step's dQ part to an fp32 buffer, the key tiles
//   of a (slice group, query tile) one after another in key-tile order, handed on by a
//   release/acquire turn counter: a fixed order, no float atomics, O(B S H N D) memory. With C = 2
//   chains (D = 32, N <= 640: tile_config.h) the even and the odd key tiles form two such chains
//   into two buffers, which dq_finalize adds in chain order.
// Roles meet at named barriers (BwdBarrier). With sDq in kDqStages stages the math can run that
// many steps ahead of the turn, and the two dQ warps keep two steps' turn chains in flight.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/kernel_attrs.h"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"
#include "attention/backward_parts.cuh"
#include "attention/dispatch.cuh"
#include "attention/kernels.h"
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

// The helper's dbias warps: the dbias partial of step gs = the partial so far + every quad's dS in
// quad order, into the block's private fp32 partial; warp `half` takes half of the tile's rows. The
// partial so far is fetched a step ahead.
template <class T, class BiasT, int D, int C>
__device__ __forceinline__ void run_dbias(const BwdBlock<T, BiasT, D, C>& k, int lane, int half) {
  using B = BwdBlock<T, BiasT, D, C>;
  using L = BwdSmem<BiasT, D, C>;
  constexpr int G = B::G, BK = B::BK, BQ = B::BQ, FS = L::kFStride;
  if (!k.part) return;
  const int cols = k.a.part_cols;
  // [BK][BQ] fp32 of a step: virtual thread vt (64 half + lane + 32 v) of 128 takes column
  // 4 (vt % (BQ/4)) of rows vt / (BQ/4) + it * kPartRows, in the fetch and in the update alike
  // (a lane reads back only what its own cp.async fetched).
  constexpr int kPartRows = 128 / (BQ / 4), kPartIters = BK / kPartRows;
  static_assert(BK % kPartRows == 0, "dbias chunks: whole rows per pass");
  auto row_col = [&](int v) {  // virtual thread v's first row and its column
    const int vt = 64 * half + lane + 32 * v;
    return make_int2(vt / (BQ / 4), 4 * (vt % (BQ / 4)));
  };
  // Whether step gs's group starts the chunk (its partial not yet written: no old value).
  auto first_group = [&](int gs) {
    return k.group_of(gs) == k.sg_begin;
  };
  auto load_old = [&](int gs) {
    if (first_group(gs)) return;
    const int q0 = k.query_tile_of(gs) * BQ;
#pragma unroll 1
    for (int v = 0; v < B::kVirt; ++v) {
      const int2 rc = row_col(v);
      const int r = rc.x, c = rc.y;
#pragma unroll
      for (int it = 0; it < kPartIters; ++it)
        dev::cp_async_16(k.sOld + (r + it * kPartRows) * FS + c, k.part + (r + it * kPartRows) * cols + q0 + c, true);
    }
  };
  load_old(0);
  dev::cp_async_commit();
  for (int gs = 0; gs < k.steps; ++gs) {
    const int q0 = k.query_tile_of(gs) * BQ;
    const bool first = first_group(gs);
    dev::bar_sync(kBarDoneB, B::kWith);  // sdSf holds step gs
    dev::cp_async_wait<0>();            // and sOld
#pragma unroll 1
    for (int v = 0; v < B::kVirt; ++v) {
      const int2 rc = row_col(v);
      const int r = rc.x, c = rc.y;
#pragma unroll 4
      for (int it = 0; it < kPartIters; ++it) {
        const int row = r + it * kPartRows;
        float4 sum = first ? make_float4(0.f, 0.f, 0.f, 0.f) : *reinterpret_cast<const float4*>(k.sOld + row * FS + c);
#pragma unroll
        for (int m = 0; m < G; ++m) {
          const float4 d = *reinterpret_cast<const float4*>(k.sdSf + (m * BK + row) * FS + c);
          sum = make_float4(sum.x + d.x, sum.y + d.y, sum.z + d.z, sum.w + d.w);
        }
        *reinterpret_cast<float4*>(k.part + row * cols + q0 + c) = sum;  // block rows: 31 bits
      }
    }
    if (gs + 1 < k.steps) {
      dev::bar_arrive(kBarDsFree, B::kWith);  // sdSf may take the next step
      load_old(gs + 1);
      dev::cp_async_commit();
    }
  }
}

// The helper's dQ warps: warp w takes the steps gs = w (mod 2), whose dQ parts are in sDq[gs %
// kDqStages]: each is added to the fp32 sum of the key tiles before this one (dq_acc) when the key
// tile's turn comes, and the turn handed on. Two warps keep two steps' turn chains (wait, fetch,
// add, store, release: latency, not work) in flight.
template <class T, class BiasT, int D, int C>
__device__ __forceinline__ void run_dq_warp(const BwdBlock<T, BiasT, D, C>& k, int lane, int w) {
  using B = BwdBlock<T, BiasT, D, C>;
  constexpr int G = B::G, BQ = B::BQ;
  constexpr int kVirt = 4;  // the warp plays all 128 threads of the geometry below
  const BwdArgs& a = k.a;
  // fp32 dQ tiles [G][BQ][D] move in 16-byte chunks: virtual thread vt (lane + 32 v) of 128 takes
  // column 4 (vt % (D/4)) of rows vt / (D/4) + it * kDqRows, rows counted over the G members' BQ
  // rows.
  constexpr int kDqRows = 128 / (D / 4), kDqIters = G * BQ / kDqRows;
  static_assert(128 % (D / 4) == 0 && BQ % kDqRows == 0, "whole dQ rows per pass");
  constexpr int DP = BwdSmem<BiasT, D, C>::kDqPitch;  // sDq's row pitch
  const int64_t dq_slice_stride = static_cast<int64_t>(k.H) * k.N * D;  // consecutive slices
  // This key tile's chain: its accumulator, its place (0: the first, which reads nothing).
  float* chain_acc = a.dq_acc + k.chain() * (static_cast<int64_t>(a.dims.B) * k.S * k.H * k.N * D);
  const int pos = k.chain_pos();
  const bool last = k.chain_last();
  constexpr int kStages = BwdConfig<D>::kDqStages;
  struct DqChunk {
    float* g;
    int tile_off, rows_left, members;
  };
  auto dq_chunk = [&](int vt, int sg, int qi) {
    const int r0 = vt / (D / 4), c = 4 * (vt % (D / 4));
    return DqChunk{chain_acc + ((static_cast<int64_t>(k.b) * k.S + sg * G) * k.H + k.h) * static_cast<int64_t>(k.N) * D +
                       (qi * BQ + r0) * D + c,
                   r0 * DP + c, k.N - qi * BQ - r0, min(G, k.S - sg * G)};
  };
  // The earlier sum is read straight into registers (L2: cg), kVB virtual threads' row passes at
  // a time, so one round trip serves 8 chunks (16 spill at the helper's register budget; one
  // cp.async round trip for the whole tile into shared memory measured no faster: perf-notes v12).
  constexpr int kVB = kDqIters >= 8 ? 1 : 8 / kDqIters;
  static_assert(kVirt % kVB == 0, "whole batches");
  for (int gs = w; gs < k.steps; gs += 2) {
    const int sg = k.group_of(gs), qi = k.query_tile_of(gs);
    const int stage = gs % kStages;
    const float* dq = k.sDq + stage * G * BQ * DP;
    dev::bar_sync(kBarDoneQ + stage, B::kWith1);  // sDq[stage] holds step gs
    // Wait for the turn: the key tiles before this one have stored theirs.
    if (pos > 0 && lane == 0)
      while (dev::ld_acquire_gpu(k.turn_of(sg, qi)) != pos) __nanosleep(32);
    __syncwarp();
#pragma unroll 1
    for (int v0 = 0; v0 < kVirt; v0 += kVB) {
      DqChunk ch[kVB];
      float4 old[kVB][kDqIters];
#pragma unroll
      for (int u = 0; u < kVB; ++u) {
        ch[u] = dq_chunk(lane + 32 * (v0 + u), sg, qi);
#pragma unroll
        for (int it = 0; it < kDqIters; ++it) {
          const int m = it * kDqRows / BQ, q = it * kDqRows % BQ;  // + this lane's row
          old[u][it] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (pos > 0 && m < ch[u].members && q < ch[u].rows_left)
            old[u][it] = __ldcg(reinterpret_cast<const float4*>(ch[u].g + m * dq_slice_stride + q * D));
        }
      }
#pragma unroll
      for (int u = 0; u < kVB; ++u)
#pragma unroll
        for (int it = 0; it < kDqIters; ++it) {
          const int m = it * kDqRows / BQ, q = it * kDqRows % BQ;
          if (m >= ch[u].members || q >= ch[u].rows_left) continue;
          const float4 o = old[u][it];
          float4 v4 = *reinterpret_cast<const float4*>(dq + (m * BQ + q) * DP + ch[u].tile_off);
          if (pos > 0) v4 = make_float4(o.x + v4.x, o.y + v4.y, o.z + v4.z, o.w + v4.w);  // earlier tiles first
          *reinterpret_cast<float4*>(ch[u].g + m * dq_slice_stride + q * D) = v4;
        }
    }
    if (gs + kStages < k.steps) dev::bar_arrive(kBarDqFree + stage, B::kWith1);  // sDq[stage] read
    // Publish the stores: __syncwarp orders the other lanes' stores before lane 0's gpu-scope
    // release, which is cumulative, so no separate fence is needed (a __threadfence there cost
    // ~1300 cycles a step when the math warps did this: perf-notes v11).
    __syncwarp();
    if (lane == 0 && !last) dev::st_release_gpu(k.turn_of(sg, qi), pos + 1);
  }
}

// Everything step gs reads, into stage gs & 1: Q, dO, LSE, Dlt of the quad's slice, the bias
// tile, and on a group's first step its K and V (double-buffered by group). Issued a step ahead
// by the math warps themselves: a ~10-instruction burst per thread, where one loader warp took
// ~5000 cycles a step to issue them (perf-notes v12).
template <class T, class BiasT, int D, int C, class QCopier, class KvCopier, class BCopier>
__device__ __forceinline__ void issue_step_loads(const BwdBlock<T, BiasT, D, C>& k, int gs, int quad, int qtid,
                                                 int tid, const QCopier& q_copier, const KvCopier& kv_copier,
                                                 const BCopier& bias_copier, const BiasT* gBias) {
  using B = BwdBlock<T, BiasT, D, C>;
  constexpr int G = B::G, BQ = B::BQ;
  const BwdArgs& a = k.a;
  const int sg = k.group_of(gs), qi = k.query_tile_of(gs), st = gs & 1, q0 = qi * BQ;
  const int s = k.slice_of(sg, quad), rows = k.rows_of(sg, quad);
  q_copier.copy(k.sQ + (st * G + quad) * BQ * D, slice_ptr<T>(a.q, k.b, s, k.h), a.q.sn, q0, rows);
  q_copier.copy(k.sdO + (st * G + quad) * BQ * D, slice_ptr<T>(a.dout, k.b, s, k.h), a.dout.sn, q0, rows);
  if (qi == 0) {
    kv_copier.copy(k.k_tile(sg, quad), slice_ptr<T>(a.k, k.b, s, k.h), a.k.sn, k.k0, rows);
    kv_copier.copy(k.v_tile(sg, quad), slice_ptr<T>(a.v, k.b, s, k.h), a.v.sn, k.k0, rows);
  }
  if (qtid < BQ) {  // LSE (log2 units) and Dlt; zero past N, harmless since dO is zero there
    const int64_t row = ((static_cast<int64_t>(k.b) * k.S + s) * k.H + k.h) * k.N + q0 + qtid;
    const bool ok = q0 + qtid < rows;
    dev::cp_async_4(k.sLse + (st * G + quad) * BQ + qtid, a.lse_log2 + row, ok);
    dev::cp_async_4(k.sDlt + (st * G + quad) * BQ + qtid, a.delta + row, ok);
  }
  bias_copier.copy(k.sBias + st * BwdSmem<BiasT, D, C>::kBiasBytes, a.bias, gBias, q0, k.k0, k.N, tid);
}

// Math warps: quad `quad` computes slice sg * G + quad of every step from the parts in
// backward_parts.cuh: P^T recomputed once from the forward's LSE, dV += P^T dO and dK += dS^T Q
// in registers, dS^T out to shared memory for the helper (fp32, dbias) and for this quad's dQ
// part = dS K (16-bit, then fp32 into sDq).
template <class T, class BiasT, int D, int C>
__device__ __forceinline__ void run_math(const BwdBlock<T, BiasT, D, C>& k, int tid) {
  using B = BwdBlock<T, BiasT, D, C>;
  using L = BwdSmem<BiasT, D, C>;
  constexpr int G = B::G, BK = B::BK, BQ = B::BQ, QT = BQ / 8, DT = D / 8;
  constexpr int kDqStages = BwdConfig<D>::kDqStages;
  constexpr bool kWg = BwdConfig<D>::kWgmma;  // wgmma for S^T, dP^T, dV, dK (tile_config.h)
  static_assert(!kWg || (D == 32 && BQ == 64 && BK == 64), "the wgmma shapes: 64 x 64 x 32 steps");
  const BwdArgs& a = k.a;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int quad = warp / 4, wq = warp % 4, qtid = tid % 128;
  const int krow[2] = {wq * 16 + g, wq * 16 + g + 8};  // this thread's keys in the block's tile
  T* qdS = k.sdS + quad * BK * BQ;                      // [BK][BQ] this quad's dS^T, 16-bit
  float* qdSf = k.sdSf + quad * BK * L::kFStride;       // [BK][BQ + 8] fp32
  const BiasT* gBias = static_cast<const BiasT*>(a.bias.ptr) + k.b * a.bias.sb + k.h * a.bias.sh;
  const TileCopier<D, BQ, 128> q_copier(qtid);  // a quad copies its own slice's tiles
  const TileCopier<D, BK, 128> kv_copier(qtid);
  const BiasCopier<BiasT, BQ, BK, B::kMath> bias_copier(tid);
  issue_step_loads(k, 0, quad, qtid, tid, q_copier, kv_copier, bias_copier, gBias);
  dev::cp_async_commit();

  // The key mask of a group's rows, fetched one group ahead.
  auto attended = [&](int sg, int r) {
    const int s = sg * G + quad;
    return s < k.S && key_attended(a.mask, k.b, s, k.k0 + krow[r], k.N);
  };
  bool attend[2], attend_next[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) attend_next[r] = attended(k.sg_begin, r);
  float dk[DT][4], dv[DT][4];  // 16 keys x D per warp, this quad's slice

  for (int gs = 0; gs < k.steps; ++gs) {
    const int st = gs & 1, sg = k.group_of(gs), qi = k.query_tile_of(gs);
    if (qi == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) attend[r] = attend_next[r];
      if (sg + 1 < k.sg_end)
#pragma unroll
        for (int r = 0; r < 2; ++r) attend_next[r] = attended(sg + 1, r);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
    }
    const StepTiles<T> tiles{k.k_tile(sg, quad),
                             k.v_tile(sg, quad),
                             k.sQ + (st * G + quad) * BQ * D,
                             k.sdO + (st * G + quad) * BQ * D,
                             k.sLse + (st * G + quad) * BQ,
                             k.sDlt + (st * G + quad) * BQ,
                             k.sBias + st * L::kBiasBytes};
    dev::cp_async_wait<0>();
    if constexpr (kWg) dev::fence_proxy_async();  // this thread's copies, visible to wgmma
    dev::bar_sync(kBarTiles, B::kMath);  // this step's tiles have landed; stage st ^ 1 is free
    if (gs + 1 < k.steps) issue_step_loads(k, gs + 1, quad, qtid, tid, q_copier, kv_copier, bias_copier, gBias);
    dev::cp_async_commit();

    // wgmma operands: the 64-byte-swizzled tiles of D = 32 elements a row.
    [[maybe_unused]] const uint64_t descK = dev::wgmma_desc_rows32(dev::smem_addr(tiles.K));
    [[maybe_unused]] const uint64_t descV = dev::wgmma_desc_rows32(dev::smem_addr(tiles.V));
    [[maybe_unused]] const uint64_t descQ = dev::wgmma_desc_rows32(dev::smem_addr(tiles.Q));
    [[maybe_unused]] const uint64_t descO = dev::wgmma_desc_rows32(dev::smem_addr(tiles.dO));
    float sT[QT][4], dpT[QT][4];  // S^T then P^T; dP^T then dS^T
    score_products<T, D, BQ, kWg>(sT, dpT, tiles, descK, descV, descQ, descO, wq, lane);
    probabilities<T, BiasT, D, BQ, BK>(sT, dpT, tiles, attend, krow, a.scale, wq, lane);
    gradient_products<T, D, BQ, kWg>(dk, dv, sT, dpT, tiles, descQ, descO, lane);

    // dS^T to shared memory: fp32 for the helper's dbias sum (once it has read the last step's),
    // 16-bit for this quad's dQ = dS K.
    if (k.part) {
      if (gs > 0) dev::bar_sync(kBarDsFree, B::kWith);
      store_ds_f32<BQ, L::kFStride>(qdSf, dpT, krow, t);
      dev::bar_arrive(kBarDoneB, B::kWith);
    }
    store_ds_16<T, BQ>(qdS, dpT, krow, t);
    dev::bar_sync(kBarQuad + quad, 128);  // the quad's dS^T tile is complete

    // The dQ part into sDq[dst], once the dQ warps have added what it held kDqStages steps ago.
    const int dst = gs % kDqStages;
    if (gs >= kDqStages) dev::bar_sync(kBarDqFree + dst, B::kWith1);
    dq_part<T, D, BQ, BK, L::kDqPitch>(k.sDq + (dst * G + quad) * BQ * L::kDqPitch, qdS, tiles.K, wq, lane);
    if constexpr (kWg) {
      dev::wgmma_wait<0>();  // dV, dK: their operands' stage is reloaded after the next barrier
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[DT * 4]>(dk));
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[DT * 4]>(dv));
    }
    dev::bar_arrive(kBarDoneQ + dst, B::kWith1);  // sDq[dst] handed over

    // A group's last step: dK and dV are complete for this slice.
    const int s = sg * G + quad;
    if (qi == k.nq - 1 && s < k.S)
      store_dk_dv<T, D>(slice_ptr_mut<T>(a.dk, k.b, s, k.h), a.dk.sn, slice_ptr_mut<T>(a.dv, k.b, s, k.h),
                        a.dv.sn, dk, dv, a.scale, k.k0, k.N, krow, t);
  }
}

template <class T, class BiasT, int D, int C>
__global__ void __launch_bounds__(BwdConfig<D>::kThreads, 1) backward_kernel(const BwdArgs a) {
  using Cfg = BwdConfig<D>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  constexpr uint32_t kAlign = BwdSmem<BiasT, D, C>::kAlign;
  uint8_t* smem = kAlign ? smem_raw + ((kAlign - (dev::smem_addr(smem_raw) & (kAlign - 1))) & (kAlign - 1)) : smem_raw;
  const BwdBlock<T, BiasT, D, C> blk(a, smem);
  if (blk.steps == 0) return;  // every role returns: no barrier is left half-arrived
  const int tid = threadIdx.x;
  if (tid >= Cfg::kMathThreads) {  // the helper warpgroup
    if constexpr (Cfg::kSplitRegs) dev::regs_decrease<Cfg::kHelperRegs>();
    const int role = (tid - Cfg::kMathThreads) / 32, lane = tid % 32;
    if (role < 2) {
      run_dbias(blk, lane, role);
    } else {
      run_dq_warp(blk, lane, role - 2);
    }
  } else {
    if constexpr (Cfg::kSplitRegs) dev::regs_increase<Cfg::kMathRegs>();
    run_math(blk, tid);
  }
}

template <class T, class BiasT, int D, int C>
cudaError_t launch_chains(const BwdArgs& a, const BwdPlan& plan, cudaStream_t stream) {
  const size_t smem = BwdSmem<BiasT, D, C>::bytes();
  auto kernel = backward_kernel<T, BiasT, D, C>;
  if (const cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, static_cast<int>(smem)); e != cudaSuccess) return e;
  const dim3 grid(plan.key_tiles, plan.chunks, a.dims.B * a.dims.H);
  kernel<<<grid, BwdConfig<D>::kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <class T, class BiasT, int D>
struct LaunchBackward {
  static cudaError_t run(const BwdArgs& a, const BwdPlan& plan, cudaStream_t stream) {
    // Only D = 32 ever takes two chains (tile_config.h): the other head dims instantiate one form.
    if constexpr (D == 32) {
      if (plan.dq_chains == 2) return launch_chains<T, BiasT, D, 2>(a, plan, stream);
    }
    return launch_chains<T, BiasT, D, 1>(a, plan, stream);
  }
};

template <int D>
BwdPlan plan_for(const Dims& d) {
  using Cfg = BwdConfig<D>;
  BwdPlan p;
  p.slice_groups = (d.S + Cfg::kSlices - 1) / Cfg::kSlices;
  p.query_tiles = (d.N + Cfg::kBlockQ - 1) / Cfg::kBlockQ;
  p.key_tiles = (d.N + Cfg::kBlockK - 1) / Cfg::kBlockK;
  const int64_t per_chunk_blocks = static_cast<int64_t>(d.B) * d.H * p.key_tiles;
  int chunks = static_cast<int>(
      std::clamp<int64_t>((kBwdTargetBlocks + per_chunk_blocks - 1) / per_chunk_blocks, 1,
                          p.slice_groups));
  p.groups_per_chunk = (p.slice_groups + chunks - 1) / chunks;
  p.chunks = (p.slice_groups + p.groups_per_chunk - 1) / p.groups_per_chunk;
  p.dq_chains = bwd_dq_chains(D, p.key_tiles);
  p.part_rows = p.key_tiles * Cfg::kBlockK;
  p.part_cols = p.query_tiles * Cfg::kBlockQ;
  return p;
}

}  // namespace

BwdPlan plan_backward(const Dims& d, int head_dim) {
  switch (head_dim) {
    case 16: return plan_for<16>(d);
    case 32: return plan_for<32>(d);
    case 64: return plan_for<64>(d);
    default: return plan_for<128>(d);
  }
}

cudaError_t launch_backward(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream) {
  bool two_pass = false;
  cudaError_t e = launch_backward_two_pass(a, fp16, head_dim, stream, &two_pass);
  if (two_pass || e != cudaSuccess) return e;
  const BwdPlan plan = plan_backward(a.dims, head_dim);
  e = launch_backward_preprocess(a, fp16, head_dim, stream);
  if (e != cudaSuccess) return e;
  e = dispatch<LaunchBackward>(fp16, a.bias.fp32, head_dim, a, plan, stream);
  if (e != cudaSuccess) return e;
  return launch_backward_reduce(a, fp16, head_dim, stream);
}

}  // namespace tpf::attn
