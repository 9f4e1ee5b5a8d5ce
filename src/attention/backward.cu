// Triangle attention backward, key-tile parallel (DESIGN.md section 1).
//
// A block owns one 64-key tile of one (b, h) and one chunk of slices. Its quads of 4 warps take
// BwdConfig::kSlices consecutive slices side by side and walk all query tiles; each probability
// tile P is recomputed once (from the forward's LSE) and feeds all four gradients:
//   dV += P^T dO, dK += dS^T Q (registers, per slice), dQ += dS K, dbias += sum_s dS.
// dQ: the key tiles of a (slice group, query tile) add their contributions to an fp32 buffer
//     one after another in key-tile order, handed on by a release/acquire turn counter: a fixed
//     order, no float atomics, O(B S H N D) memory.
// dbias: the quads' dS tiles are summed in shared memory in quad order, then added to the
//     block's private fp32 partial of its slice chunk; the chunks are summed in order later.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/kernel_attrs.h"
#include "common/phase_timer.cuh"
#include "attention/dispatch.cuh"
#include "attention/kernels.h"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"

// Timing experiment only (wrong dQ): skip waiting for the dQ turn, to measure what it costs.
#ifndef TPF_EXPERIMENT_NO_DQ_ORDER
#define TPF_EXPERIMENT_NO_DQ_ORDER 0
#endif

namespace tpf::attn {
namespace {

// Shared memory of one block, in elements; the regions follow one another in this order.
template <class BiasT, int D>
struct BwdSmem {
  using Cfg = BwdConfig<D>;
  static constexpr int G = Cfg::kSlices, BK = Cfg::kBlockK, BQ = Cfg::kBlockQ;
  static constexpr int kFStride = BQ + 8;      // fp32 [BK][BQ] rows padded: float2 writes of 8
                                               // rows x 4 lanes hit distinct banks per half-warp
  // 16-bit regions
  static constexpr int kK = G * BK * D;        // sK    [G][BK][D]       swizzled
  static constexpr int kV = G * BK * D;        // sV    [G][BK][D]
  static constexpr int kQ = 2 * G * BQ * D;    // sQ    [2][G][BQ][D]    double-buffered
  static constexpr int kDO = 2 * G * BQ * D;   // sdO   [2][G][BQ][D]
  static constexpr int kDS = G * BK * BQ;      // sdS   [G][BK][BQ]      dS^T, swizzled
  static constexpr int k16 = kK + kV + kQ + kDO + kDS;
  // fp32 regions
  static constexpr int kLse = 2 * G * BQ;      // sLse  [2][G][BQ]       LSE * log2(e)
  static constexpr int kDlt = 2 * G * BQ;      // sDlt  [2][G][BQ]
  static constexpr int kOld = 2 * BK * kFStride;  // sOld [2][BK][BQ+8]   dbias partial so far
  static constexpr int kDSf = G > 1 ? G * BK * kFStride : 0;  // sdSf [G][BK][BQ+8] dS^T, fp32 (for the other quads)
  static constexpr int kDq = G * BQ * D;       // sDq   [G][BQ][D]       this key tile's dQ part
  static constexpr int kDqOld = G * BQ * D;    // sDqOld [G][BQ][D]      dQ of earlier key tiles
  static constexpr int k32 = kLse + kDlt + kOld + kDSf + kDq + kDqOld;
  // bias tiles [2] (bias dtype, BiasTile layout)
  static constexpr int kBiasBytes = BiasTile<BiasT, BQ, BK>::kBytes;
  static constexpr size_t bytes() { return size_t(k16) * 2 + size_t(k32) * 4 + 2 * kBiasBytes; }
};

template <class T, class BiasT, int D>
__global__ void __launch_bounds__(BwdConfig<D>::kThreads, BwdConfig<D>::kMinBlocks)
    backward_kernel(const BwdArgs a) {
  using Cfg = BwdConfig<D>;
  using L = BwdSmem<BiasT, D>;
  using Mma = dev::MmaOp<T>;
  constexpr int G = Cfg::kSlices, BK = Cfg::kBlockK, BQ = Cfg::kBlockQ, NT = Cfg::kThreads;
  constexpr int QT = BQ / 8, DT = D / 8, KS = D / 16, FS = L::kFStride;
  constexpr int kDqUnits = (BQ / 16) * (D / 16) / 4;  // 16x16 blocks of dQ per warp (0 at D=16)
  constexpr int kDqUnitsPerWarp = kDqUnits > 0 ? kDqUnits : 1;
  static_assert(QT % G == 0, "each quad finishes a whole number of query n-tiles of dbias");

  extern __shared__ __align__(128) uint8_t smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + L::kK;
  T* sQ = sV + L::kV;
  T* sdO = sQ + L::kQ;
  T* sdS = sdO + L::kDO;
  float* sLse = reinterpret_cast<float*>(sdS + L::kDS);
  float* sDlt = sLse + L::kLse;
  float* sOld = sDlt + L::kDlt;
  float* sdSf = sOld + L::kOld;
  float* sDq = sdSf + L::kDSf;
  float* sDqOld = sDq + L::kDq;
  uint8_t* sBias = reinterpret_cast<uint8_t*>(sDqOld + L::kDqOld);

  const int N = a.dims.N, S = a.dims.S, H = a.dims.H;
  const int kb = blockIdx.x, chunk = blockIdx.y;
  const int b = blockIdx.z / H, h = blockIdx.z % H;
  const int k0 = kb * BK;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int quad = warp / 4, wq = warp % 4, qtid = tid % 128;
  const int n_sg = (S + G - 1) / G, nq = (N + BQ - 1) / BQ;
  const int sg_begin = chunk * a.groups_per_chunk;
  const int sg_end = min(n_sg, sg_begin + a.groups_per_chunk);
  const BiasT* gBias = static_cast<const BiasT*>(a.bias.ptr) + b * a.bias.sb + h * a.bias.sh;
  const TileCopier<D, BQ, 128> q_copier(qtid);   // a quad copies its own slice's tiles
  const TileCopier<D, BK, 128> kv_copier(qtid);
  const BiasCopier<BiasT, BQ, BK, NT> bias_copier(tid);
  constexpr float kLog2e = 1.4426950408889634f;
  // This block's dbias partial: rows = its BK keys, all Nq (padded) query columns.
  float* part = a.dbias_part
                    ? a.dbias_part + ((static_cast<int64_t>(chunk) * a.dims.B + b) * H + h) *
                                         static_cast<int64_t>(a.part_rows) * a.part_cols +
                          static_cast<int64_t>(k0) * a.part_cols
                    : nullptr;
  // This warp's 16 keys: thread rows krow[0] = g, krow[1] = g + 8 of the warp's block.
  const int krow[2] = {wq * 16 + g, wq * 16 + g + 8};

  T* qK = sK + quad * BK * D;  // this quad's slice tiles
  T* qV = sV + quad * BK * D;
  T* qdS = sdS + quad * BK * BQ;
  float* qdSf = sdSf + quad * BK * FS;

  // fp32 dQ tiles [G][BQ][D] (sDq, sDqOld <-> dq_acc) move in 16-byte chunks: thread tid takes
  // column 4 (tid % (D/4)) of rows tid / (D/4) + it * kDqRows, rows counted over the G members'
  // BQ rows. kDqRows divides BQ, so an unrolled iteration's member and row step are constants and
  // a chunk's address is one per-call base plus immediates (no 64-bit math per chunk). Both
  // functions map each chunk to the same thread: a thread reads back only what its own cp.async
  // fetched, so waiting for its own copies is enough, with no barrier.
  constexpr int kDqRows = NT / (D / 4), kDqIters = G * BQ / kDqRows;
  static_assert(NT % (D / 4) == 0 && BQ % kDqRows == 0, "whole dQ rows per iteration");
  constexpr int kDqUnroll = kDqIters <= 4 ? kDqIters : 1;  // D = 128's 8 chunks spill unrolled
  const int64_t dq_slice_stride = static_cast<int64_t>(H) * N * D;  // consecutive slices
  // This thread's chunk of member 0 at step qi, its tile offset (row * D + column) and the
  // rows / members that exist (the last query tile and slice group may be partial).
  struct DqChunk {
    float* g;
    int tile_off, rows_left, members;
  };
  auto dq_chunk = [&](int sg, int qi) {
    const int r0 = tid / (D / 4), c = 4 * (tid % (D / 4));
    return DqChunk{a.dq_acc + ((static_cast<int64_t>(b) * S + sg * G) * H + h) * static_cast<int64_t>(N) * D +
                       (qi * BQ + r0) * D + c,
                   r0 * D + c, N - qi * BQ - r0, min(G, S - sg * G)};
  };
  auto fetch_dq_old = [&](int sg, int qi) {
    const DqChunk ch = dq_chunk(sg, qi);
#pragma unroll kDqUnroll
    for (int it = 0; it < kDqIters; ++it) {
      const int m = it * kDqRows / BQ, q = it * kDqRows % BQ;  // + this thread's row
      if (m < ch.members && q < ch.rows_left)
        dev::cp_async_16(sDqOld + (m * BQ + q) * D + ch.tile_off, ch.g + m * dq_slice_stride + q * D, true);
    }
  };
  auto finish_dq = [&](int sg, int qi) {
    const DqChunk ch = dq_chunk(sg, qi);
#pragma unroll kDqUnroll
    for (int it = 0; it < kDqIters; ++it) {
      const int m = it * kDqRows / BQ, q = it * kDqRows % BQ;
      if (m >= ch.members || q >= ch.rows_left) continue;
      float4 v = *reinterpret_cast<const float4*>(sDq + (m * BQ + q) * D + ch.tile_off);
      if (kb > 0) {
        const float4 o = *reinterpret_cast<const float4*>(sDqOld + (m * BQ + q) * D + ch.tile_off);
        v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);  // earlier tiles first
      }
      *reinterpret_cast<float4*>(ch.g + m * dq_slice_stride + q * D) = v;
    }
  };

  // The dbias partial so far [BK][BQ] fp32 of a step (sOld <- part): thread tid fetches column
  // 4 (tid % (BQ/4)) of rows tid / (BQ/4) + it * kPartRows, likewise fixed.
  constexpr int kPartRows = NT / (BQ / 4), kPartIters = BK / kPartRows;
  static_assert(NT % (BQ / 4) == 0 && BK % kPartRows == 0, "dbias chunks: whole rows per iteration");

  auto turn_of = [&](int sg, int qi) {
    return a.dq_turn + ((static_cast<int64_t>(b) * H + h) * n_sg + sg) * nq + qi;
  };
  // After a barrier that follows every thread's dQ stores, one thread publishes them with a
  // gpu-scope release of the next key tile's turn. The barrier orders the other threads' stores
  // before that release, which is cumulative, so no separate fence is needed (a __threadfence,
  // i.e. fence.sc.gpu, there cost thread 0's warp ~1300 cycles of a ~6400-cycle step, which the
  // whole block then waited for at the next barrier: perf-notes v11).
  auto release_turn = [&](int sg, int qi) {
    if (tid == 0 && kb + 1 < static_cast<int>(gridDim.x)) dev::st_release_gpu(turn_of(sg, qi), kb + 1);
  };

  // Phases of a step (timing experiment, see phase_timer.cuh): loads + barrier A, S^T and dP^T,
  // P and dS, dV and dK, dS stores + dQ finish, barrier B, turn release + dbias, dQ part, turn
  // wait, barrier C.
  dev::PhaseTimer<Cfg::kWarps, 10> phases(warp, lane);
  for (int sg = sg_begin; sg < sg_end; ++sg) {
    const int s = sg * G + quad;
    const bool active = s < S;
    const int s_ld = active ? s : 0;  // inactive quads read slice 0 but keep zero rows
    const int rows = active ? N : 0;
    const bool first_group = sg == sg_begin;  // dbias partial not yet written in this chunk
    const T* gQ = slice_ptr<T>(a.q, b, s_ld, h);
    const T* gdO = slice_ptr<T>(a.dout, b, s_ld, h);
    const int64_t row_base = ((static_cast<int64_t>(b) * S + s_ld) * H + h) * N;  // [B,S,H,N]

    // Everything step `qi` reads, into stage `st`: Q, dO, LSE, Dlt of each quad's slice, the
    // bias tile, and the dbias partial so far.
    auto load_step = [&](int qi, int st) {
      const int q0 = qi * BQ;
      q_copier.copy(sQ + (st * G + quad) * BQ * D, gQ, a.q.sn, q0, rows);
      q_copier.copy(sdO + (st * G + quad) * BQ * D, gdO, a.dout.sn, q0, rows);
      if (qtid < BQ) {  // LSE (natural log) and Dlt; zero past N, harmless since dO is zero there
        const bool ok = q0 + qtid < rows;
        dev::cp_async_4(sLse + (st * G + quad) * BQ + qtid, a.lse_log2 + row_base + q0 + qtid, ok);
        dev::cp_async_4(sDlt + (st * G + quad) * BQ + qtid, a.delta + row_base + q0 + qtid, ok);
      }
      bias_copier.copy(sBias + st * L::kBiasBytes, a.bias, gBias, q0, k0, N, tid);
      if (part && !first_group)
#pragma unroll
        for (int it = 0; it < kPartIters; ++it) {
          const int k = tid / (BQ / 4) + it * kPartRows, c = 4 * (tid % (BQ / 4));
          dev::cp_async_16(sOld + st * BK * FS + k * FS + c, part + k * a.part_cols + q0 + c, true);
        }
    };

    kv_copier.copy(qK, slice_ptr<T>(a.k, b, s_ld, h), a.k.sn, k0, rows);
    kv_copier.copy(qV, slice_ptr<T>(a.v, b, s_ld, h), a.v.sn, k0, rows);
    load_step(0, 0);
    dev::cp_async_commit();
    bool attend[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) attend[r] = active && key_attended(a.mask, b, s_ld, k0 + krow[r], N);

    float dk[DT][4] = {}, dv[DT][4] = {};  // 16 keys x D per warp, this quad's slice

    // Per step two cp.async groups are committed (possibly empty): the pending step's earlier
    // dQ sum, then the next step's tiles.
    for (int qi = 0; qi < nq; ++qi) {
      const int st = qi & 1, q0 = qi * BQ;
      if (qi > 0 && kb > 0) fetch_dq_old(sg, qi - 1);  // its turn was taken before barrier (C)
      dev::cp_async_commit();
      if (qi + 1 < nq) load_step(qi + 1, st ^ 1);
      dev::cp_async_commit();
      dev::cp_async_wait<2>();
      __syncthreads();  // (A) this step's tiles have landed
      phases.mark(0);

      const T* tQ = sQ + (st * G + quad) * BQ * D;
      const T* tdO = sdO + (st * G + quad) * BQ * D;
      const float* tLse = sLse + (st * G + quad) * BQ;
      const float* tDlt = sDlt + (st * G + quad) * BQ;
      const uint8_t* tBias = sBias + st * L::kBiasBytes;

      // S^T = K Q^T and dP^T = V dO^T: 16 keys x BQ queries per warp.
      float sT[QT][4] = {}, dpT[QT][4] = {};
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t ka[4], va[4];
        dev::ldmatrix_x4(ka, tile_at<D>(qK, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                        ks * 2 + (lane >> 4)));
        dev::ldmatrix_x4(va, tile_at<D>(qV, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                        ks * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < QT / 2; ++np) {
          uint32_t qb[4], ob[4];
          const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
          dev::ldmatrix_x4(qb, tile_at<D>(tQ, r, c));
          dev::ldmatrix_x4(ob, tile_at<D>(tdO, r, c));
          Mma::run(sT[2 * np], ka, qb[0], qb[1]);
          Mma::run(sT[2 * np + 1], ka, qb[2], qb[3]);
          Mma::run(dpT[2 * np], va, ob[0], ob[1]);
          Mma::run(dpT[2 * np + 1], va, ob[2], ob[3]);
        }
      }

      phases.mark(1);
      // P^T = exp(S^T * scale + bias - LSE); dS^T = P^T (dP^T - Dlt).
      // 16-bit bias by ldmatrix.x4.trans: S^T pairs of n-tiles nt, nt + 1 (loaded at even nt).
      // Not at D = 128, whose registers are all taken (the extra four spill).
      constexpr bool kBiasX4 = sizeof(BiasT) == 2 && D <= 64;
      uint32_t bp[4];
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
        if constexpr (kBiasX4) {
          using X4 = BiasX4Trans<BiasT, BQ, BK>;
          if (nt % 2 == 0) X4::load(bp, dev::smem_addr(tBias) + X4::offset(wq * 16, lane) + nt * 8 * X4::kColStep);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, q = nt * 8 + 2 * t + (e & 1);
          float bias;
          if constexpr (kBiasX4) {
            const float2 pair = dev::pair_to_float2<BiasT>(bp[2 * (nt % 2) + r]);
            bias = e & 1 ? pair.y : pair.x;
          } else {
            bias = bias_at<BiasT, BQ, BK>(tBias, q, krow[r]);
          }
          const float x = fmaf(fmaf(sT[nt][e], a.scale, bias), kLog2e, -tLse[q]);
          const float p = attend[r] ? dev::exp2_approx(x) : 0.f;
          sT[nt][e] = p;
          dpT[nt][e] = p * (dpT[nt][e] - tDlt[q]);
        }
      }

      phases.mark(2);
      // dV += P^T dO and dK += dS^T Q (16-bit P^T, dS^T as A operands, straight from registers).
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t pa[4], sa[4];
        dev::acc_to_a<T>(pa, sT[2 * kk], sT[2 * kk + 1]);
        dev::acc_to_a<T>(sa, dpT[2 * kk], dpT[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t ob[4], qb[4];
          const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 2 + (lane >> 4);
          dev::ldmatrix_x4_trans(ob, tile_at<D>(tdO, r, c));
          dev::ldmatrix_x4_trans(qb, tile_at<D>(tQ, r, c));
          Mma::run(dv[2 * dp], pa, ob[0], ob[1]);
          Mma::run(dv[2 * dp + 1], pa, ob[2], ob[3]);
          Mma::run(dk[2 * dp], sa, qb[0], qb[1]);
          Mma::run(dk[2 * dp + 1], sa, qb[2], qb[3]);
        }
      }

      phases.mark(3);
      // dS^T to shared memory: 16-bit for dQ = dS K; fp32 for the other quads' bias-gradient sums.
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float d0 = dpT[nt][2 * r], d1 = dpT[nt][2 * r + 1];
          *reinterpret_cast<uint32_t*>(tile_at<BQ>(qdS, krow[r], nt) + 2 * t) = Mma::pack(d0, d1);
          if (G > 1 && part && nt / (QT / G) != quad)  // only the n-tiles other quads finish
            *reinterpret_cast<float2*>(qdSf + krow[r] * FS + nt * 8 + 2 * t) = make_float2(d0, d1);
        }
      // The previous step's dQ: its earlier sum has been fetching during the math above.
      if (qi > 0) {
        dev::cp_async_wait<1>();
        finish_dq(sg, qi - 1);
      }
      phases.mark(4);
      __syncthreads();  // (B) dS tiles complete; the previous step's dQ stored
      phases.mark(5);
      if (qi > 0) release_turn(sg, qi - 1);  // (here, not after (C): +4%, perf-notes v11)

      // Bias gradient: quad m finishes query n-tiles [m QT/G, (m+1) QT/G) of the block's tile:
      // the partial so far, then every quad's dS in quad order (its own straight from registers).
      if (part) {
        const float* old = sOld + st * BK * FS;
#pragma unroll
        for (int nt = 0; nt < QT; ++nt) {
          if (nt / (QT / G) != quad) continue;  // compile-time nt: no dynamic register indexing
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int q = nt * 8 + 2 * t;
            float2 sum = first_group ? make_float2(0.f, 0.f)
                                     : *reinterpret_cast<const float2*>(old + krow[r] * FS + q);
#pragma unroll
            for (int m = 0; m < G; ++m) {
              const float2 d = m == quad ? make_float2(dpT[nt][2 * r], dpT[nt][2 * r + 1])
                                         : *reinterpret_cast<const float2*>(
                                               sdSf + m * BK * FS + krow[r] * FS + q);
              sum.x += d.x;
              sum.y += d.y;
            }
            *reinterpret_cast<float2*>(part + krow[r] * a.part_cols + q0 + q) = sum;  // block rows: 31 bits
          }
        }
      }

      phases.mark(6);
      // dQ part of this key tile: dS (BQ x BK) K (BK x D), in 16 x 16 units per warp, to sDq.
      const bool dq_warp = kDqUnits > 0 || wq < (BQ / 16) * (D / 16);
      if (dq_warp) {
#pragma unroll
        for (int u = 0; u < kDqUnitsPerWarp; ++u) {
          const int unit = wq + 4 * u, qg = unit % (BQ / 16), dg = unit / (BQ / 16);
          float dq[2][4] = {};
#pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t sa[4], kb4[4];
            dev::ldmatrix_x4_trans(sa, tile_at<BQ>(qdS, kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                   qg * 2 + ((lane >> 3) & 1)));
            dev::ldmatrix_x4_trans(kb4, tile_at<D>(qK, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                   dg * 2 + (lane >> 4)));
            Mma::run(dq[0], sa, kb4[0], kb4[1]);
            Mma::run(dq[1], sa, kb4[2], kb4[3]);
          }
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              *reinterpret_cast<float2*>(sDq + (quad * BQ + qg * 16 + g + 8 * r) * D + dg * 16 +
                                         n * 8 + 2 * t) = make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
        }
      }

      phases.mark(7);
      // Wait for this step's dQ turn: the key tiles before this one have stored theirs.
      if (kb > 0 && tid == 0 && !TPF_EXPERIMENT_NO_DQ_ORDER) {
        const int* turn = turn_of(sg, qi);
        while (dev::ld_acquire_gpu(turn) != kb) __nanosleep(64);
      }
      phases.mark(8);
      __syncthreads();  // (C) turn taken; sDq written; this step's shared tiles are free
      phases.mark(9);
    }

    // The last step's dQ, then dK = scale * dS^T Q and dV, complete for this slice.
    if (kb > 0) fetch_dq_old(sg, nq - 1);
    dev::cp_async_commit();
    dev::cp_async_wait<0>();
    finish_dq(sg, nq - 1);
    __syncthreads();
    release_turn(sg, nq - 1);
    if (active) {
      T* gdK = slice_ptr_mut<T>(a.dk, b, s, h);
      T* gdV = slice_ptr_mut<T>(a.dv, b, s, h);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int k = k0 + krow[r];
        if (k >= N) continue;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int d = dt * 8 + 2 * t;
          *reinterpret_cast<uint32_t*>(gdK + k * a.dk.sn + d) =
              Mma::pack(dk[dt][2 * r] * a.scale, dk[dt][2 * r + 1] * a.scale);
          *reinterpret_cast<uint32_t*>(gdV + k * a.dv.sn + d) =
              Mma::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
      }
    }
  }
  if ((warp == 0 || warp == Cfg::kWarps / 2) && blockIdx.y == 0 && blockIdx.z == 0 && (kb == 0 || kb == 6))
    phases.print("backward", kb, warp, static_cast<long long>(sg_end - sg_begin) * nq);
}

template <class T, class BiasT, int D>
struct LaunchBackward {
  static cudaError_t run(const BwdArgs& a, const BwdPlan& plan, cudaStream_t stream) {
    const size_t smem = BwdSmem<BiasT, D>::bytes();
    auto kernel = backward_kernel<T, BiasT, D>;
    if (const cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, static_cast<int>(smem)); e != cudaSuccess) return e;
    const dim3 grid(plan.key_tiles, plan.chunks, a.dims.B * a.dims.H);
    kernel<<<grid, BwdConfig<D>::kThreads, smem, stream>>>(a);
    return cudaGetLastError();
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
