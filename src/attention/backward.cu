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
#include "attention/dispatch.cuh"
#include "attention/kernels.h"
#include "attention/backward_block.cuh"
#include "attention/backward_math.cuh"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"

namespace tpf::attn {
namespace {

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

// Math warps: quad `quad` computes slice sg * G + quad of every step: P^T recomputed once from
// the forward's LSE, dV += P^T dO and dK += dS^T Q in registers, dS^T out to shared memory for
// the helper (fp32, dbias) and for this quad's dQ part = dS K (16-bit, then fp32 into sDq).
template <class T, class BiasT, int D, int C>
__device__ __forceinline__ void run_math(const BwdBlock<T, BiasT, D, C>& k, int tid) {
  using M = BwdMath<T, BiasT, D, C>;
  using B = BwdBlock<T, BiasT, D, C>;
  constexpr int kDqStages = BwdConfig<D>::kDqStages;
  const M m(k, tid);
  m.load_step(0);
  dev::cp_async_commit();
  bool attend[2], attend_next[2];  // the key mask of a group's rows, fetched one group ahead
#pragma unroll
  for (int r = 0; r < 2; ++r) attend_next[r] = m.attended(k.sg_begin, r);
  float dk[M::DT][4], dv[M::DT][4];  // 16 keys x D per warp, this quad's slice

  for (int gs = 0; gs < k.steps; ++gs) {
    const int sg = k.group_of(gs), qi = k.query_tile_of(gs);
    if (qi == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) attend[r] = attend_next[r];
      if (sg + 1 < k.sg_end)
#pragma unroll
        for (int r = 0; r < 2; ++r) attend_next[r] = m.attended(sg + 1, r);
#pragma unroll
      for (int dt = 0; dt < M::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
    }
    dev::cp_async_wait<0>();
    if constexpr (M::kWg) dev::fence_proxy_async();  // this thread's copies, visible to wgmma
    dev::bar_sync(kBarTiles, B::kMath);  // this step's tiles have landed; stage st ^ 1 is free
    if (gs + 1 < k.steps) m.load_step(gs + 1);
    dev::cp_async_commit();
    const typename M::Tiles ts = m.tiles(gs);

    float sT[M::QT][4], dpT[M::QT][4];  // S^T, dP^T, then P^T, dS^T: 16 keys x BQ queries
    m.scores(sT, dpT, ts);
    m.softmax_backward(sT, dpT, ts, attend);
    m.accumulate_dv_dk(dk, dv, sT, dpT, ts);
    m.stage_ds(dpT, gs);

    // dQ part of this key tile to sDq[dst], once the dQ warps have added what it held kDqStages
    // steps ago; then handed over.
    const int dst = gs % kDqStages;
    if (gs >= kDqStages) dev::bar_sync(kBarDqFree + dst, B::kWith1);
    m.dq_part(ts.K, k.sDq + (dst * B::G + m.quad) * B::BQ * BwdSmem<BiasT, D, C>::kDqPitch);
    M::wait_dv_dk(dk, dv);
    dev::bar_arrive(kBarDoneQ + dst, B::kWith1);

    const int s = sg * B::G + m.quad;
    if (qi == k.nq - 1 && s < k.S) m.write_dk_dv(dk, dv, s);
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

cudaError_t launch_backward_preprocess(const BwdArgs& a, bool fp16, int head_dim,
                                       cudaStream_t stream);
cudaError_t launch_backward_reduce(const BwdArgs& a, bool fp16, int head_dim,
                                   cudaStream_t stream);

cudaError_t launch_backward(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream) {
  const BwdPlan plan = plan_backward(a.dims, head_dim);
  cudaError_t e = launch_backward_preprocess(a, fp16, head_dim, stream);
  if (e != cudaSuccess) return e;
  e = dispatch<LaunchBackward>(fp16, a.bias.fp32, head_dim, a, plan, stream);
  if (e != cudaSuccess) return e;
  return launch_backward_reduce(a, fp16, head_dim, stream);
}

}  // namespace tpf::attn
