// The attention backward's math warps (backward.cu), composed of parts in the order a step meets
// them: the step's tile loads (load_step), the products S^T = K Q^T and dP^T = V dO^T (scores),
// the score modifier and softmax backward P^T, dS^T (softmax_backward), dV += P^T dO and
// dK += dS^T Q (accumulate_dv_dk), dS^T handed to the helper and staged for dQ (stage_ds), this
// key tile's dQ part (dq_part), and the epilogue of a slice group (write_dk_dv).
//
// Warp layout: quad `quad` (4 warps; with wgmma one warpgroup) computes slice sg * G + quad of
// every step; each warp owns 16 keys of the block's BK, thread rows krow[0] = g, krow[1] = g + 8.
// Accumulators are [n8 tile][C fragment] in mma.sync's layout (wgmma's is the same per warp).
#pragma once
#include "attention/backward_block.cuh"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"

namespace tpf::attn {
namespace {

template <class T, class BiasT, int D, int C>
struct BwdMath {
  using B = BwdBlock<T, BiasT, D, C>;
  using L = BwdSmem<BiasT, D, C>;
  using Mma = dev::MmaOp<T>;
  static constexpr int G = B::G, BK = B::BK, BQ = B::BQ;
  static constexpr int QT = BQ / 8, DT = D / 8, KS = D / 16, FS = L::kFStride;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr bool kWg = BwdConfig<D>::kWgmma;  // wgmma for S^T, dP^T, dV, dK (tile_config.h)
  static_assert(!kWg || (D == 32 && BQ == 64 && BK == 64), "the wgmma shapes: 64 x 64 x 32 steps");

  // The tiles of one step in shared memory.
  struct Tiles {
    const T *K, *V;        // [BK][D] this quad's slice group
    const T *Q, *dO;       // [BQ][D] this step's query tile
    const float *lse, *dlt;  // [BQ] LSE * log2(e), Dlt
    const uint8_t* bias;   // [BQ][BK] BiasTile
  };
  // wgmma descriptors of a step's K, V, Q, dO (64-byte-swizzled rows of D = 32 elements): K-major
  // for S^T and dP^T (a k16 step: + 2 in the descriptor), Q, dO MN-major for dV, dK (+ 64). Made
  // after the step's barrier, where they are used.
  struct Descs {
    uint64_t K, V, Q, O;
    __device__ __forceinline__ explicit Descs(const Tiles& ts)
        : K(dev::wgmma_desc_rows32(dev::smem_addr(ts.K))), V(dev::wgmma_desc_rows32(dev::smem_addr(ts.V))),
          Q(dev::wgmma_desc_rows32(dev::smem_addr(ts.Q))), O(dev::wgmma_desc_rows32(dev::smem_addr(ts.dO))) {}
  };

  const B& k;
  const BwdArgs& a;
  const int tid, warp, lane, g, t, quad, wq, qtid;
  const int krow[2];  // this thread's keys in the block's tile
  T* const qdS;       // [BK][BQ] this quad's dS^T, 16-bit, swizzled
  float* const qdSf;  // [BK][FS] this quad's dS^T, fp32
  const BiasT* const gBias;
  const TileCopier<D, BQ, 128> q_copier;  // a quad copies its own slice's tiles
  const TileCopier<D, BK, 128> kv_copier;
  const BiasCopier<BiasT, BQ, BK, B::kMath> bias_copier;

  __device__ __forceinline__ BwdMath(const B& k_, int tid_)
      : k(k_), a(k_.a), tid(tid_), warp(tid_ / 32), lane(tid_ % 32), g(lane / 4), t(lane % 4), quad(warp / 4),
        wq(warp % 4), qtid(tid_ % 128), krow{wq * 16 + g, wq * 16 + g + 8}, qdS(k_.sdS + quad * BK * BQ),
        qdSf(k_.sdSf + quad * BK * FS),
        gBias(static_cast<const BiasT*>(k_.a.bias.ptr) + k_.b * k_.a.bias.sb + k_.h * k_.a.bias.sh),
        q_copier(qtid), kv_copier(qtid), bias_copier(tid_) {}

  // Everything step gs reads, into stage gs & 1: Q, dO, LSE, Dlt of each quad's slice, the bias
  // tile, and on a group's first step its K and V (double-buffered by group). Issued a step
  // ahead by the math warps themselves: a ~10-instruction burst per thread, where one loader
  // warp took ~5000 cycles a step to issue them (perf-notes v12).
  __device__ __forceinline__ void load_step(int gs) const {
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
    bias_copier.copy(k.sBias + st * L::kBiasBytes, a.bias, gBias, q0, k.k0, k.N, tid);
  }

  // Whether key row r of this thread is attended in slice group sg's slice of this quad.
  __device__ __forceinline__ bool attended(int sg, int r) const {
    const int s = sg * G + quad;
    return s < k.S && key_attended(a.mask, k.b, s, k.k0 + krow[r], k.N);
  }

  __device__ __forceinline__ Tiles tiles(int gs) const {
    const int st = gs & 1, sg = k.group_of(gs);
    Tiles ts;
    ts.K = k.k_tile(sg, quad);
    ts.V = k.v_tile(sg, quad);
    ts.Q = k.sQ + (st * G + quad) * BQ * D;
    ts.dO = k.sdO + (st * G + quad) * BQ * D;
    ts.lse = k.sLse + (st * G + quad) * BQ;
    ts.dlt = k.sDlt + (st * G + quad) * BQ;
    ts.bias = k.sBias + st * L::kBiasBytes;
    return ts;
  }

  // S^T = K Q^T and dP^T = V dO^T: 16 keys x BQ queries per warp (wgmma: the quad's 64 keys).
  __device__ __forceinline__ void scores(float (&sT)[QT][4], float (&dpT)[QT][4], const Tiles& ts) const {
    if constexpr (kWg) {
      const Descs ds(ts);
      float(&s_flat)[QT * 4] = reinterpret_cast<float(&)[QT * 4]>(sT);
      float(&dp_flat)[QT * 4] = reinterpret_cast<float(&)[QT * 4]>(dpT);
      dev::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        dev::WgmmaSS<T, BQ, 0, 0>::run(s_flat, ds.K + 2 * ks, ds.Q + 2 * ks, ks > 0);
        dev::WgmmaSS<T, BQ, 0, 0>::run(dp_flat, ds.V + 2 * ks, ds.O + 2 * ks, ks > 0);
      }
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::wgmma_fence_operands(s_flat);
      dev::wgmma_fence_operands(dp_flat);
    } else {
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sT[nt][e] = dpT[nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t ka[4], va[4];
        dev::ldmatrix_x4(ka, tile_at<D>(ts.K, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 2 + (lane >> 4)));
        dev::ldmatrix_x4(va, tile_at<D>(ts.V, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < QT / 2; ++np) {
          uint32_t qb[4], ob[4];
          const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
          dev::ldmatrix_x4(qb, tile_at<D>(ts.Q, r, c));
          dev::ldmatrix_x4(ob, tile_at<D>(ts.dO, r, c));
          dev::mma_n16<T>(sT[2 * np], sT[2 * np + 1], ka, qb);
          dev::mma_n16<T>(dpT[2 * np], dpT[2 * np + 1], va, ob);
        }
      }
    }
  }

  // Score modifier and softmax backward, in place: P^T = exp(S^T * scale + bias - LSE) (0 on a
  // masked key), dS^T = P^T (dP^T - Dlt). A 16-bit bias comes by ldmatrix.x4.trans: S^T pairs of
  // n-tiles nt, nt + 1 (loaded at even nt); not at D = 128, whose registers are all taken (the
  // extra four spill).
  __device__ __forceinline__ void softmax_backward(float (&sT)[QT][4], float (&dpT)[QT][4], const Tiles& ts,
                                                   const bool (&attend)[2]) const {
    constexpr bool kBiasX4 = sizeof(BiasT) == 2 && D <= 64;
    uint32_t bp[4];
#pragma unroll
    for (int nt = 0; nt < QT; ++nt) {
      if constexpr (kBiasX4) {
        using X4 = BiasX4Trans<BiasT, BQ, BK>;
        if (nt % 2 == 0) X4::load(bp, dev::smem_addr(ts.bias) + X4::offset(wq * 16, lane) + nt * 8 * X4::kColStep);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, q = nt * 8 + 2 * t + (e & 1);
        float bias;
        if constexpr (kBiasX4) {
          const float2 pair = dev::pair_to_float2<BiasT>(bp[2 * (nt % 2) + r]);
          bias = e & 1 ? pair.y : pair.x;
        } else {
          bias = bias_at<BiasT, BQ, BK>(ts.bias, q, krow[r]);
        }
        const float x = fmaf(fmaf(sT[nt][e], a.scale, bias), kLog2e, -ts.lse[q]);
        const float p = attend[r] ? dev::exp2_approx(x) : 0.f;
        sT[nt][e] = p;
        dpT[nt][e] = p * (dpT[nt][e] - ts.dlt[q]);
      }
    }
  }

  // dV += P^T dO and dK += dS^T Q (16-bit P^T, dS^T as A operands, straight from registers).
  // wgmma: issued here, run while the dS^T tiles are stored, waited for by wait_dv_dk.
  __device__ __forceinline__ void accumulate_dv_dk(float (&dk)[DT][4], float (&dv)[DT][4], const float (&pT)[QT][4],
                                                   const float (&dsT)[QT][4], const Tiles& ts) const {
    if constexpr (kWg) {
      float(&dk_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(dk);  // wgmma's view
      float(&dv_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(dv);
      const Descs ds(ts);
      uint32_t pa[BQ / 16][4], sa[BQ / 16][4];  // unchanged until the wait
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        dev::acc_to_a<T>(pa[kk], pT[2 * kk], pT[2 * kk + 1]);
        dev::acc_to_a<T>(sa[kk], dsT[2 * kk], dsT[2 * kk + 1]);
      }
      dev::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        dev::WgmmaN32RS<T, 1>::run(dv_flat, pa[kk], ds.O + 64 * kk, 1);
        dev::WgmmaN32RS<T, 1>::run(dk_flat, sa[kk], ds.Q + 64 * kk, 1);
      }
      dev::wgmma_commit();
    } else {
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t pa[4], sa[4];
        dev::acc_to_a<T>(pa, pT[2 * kk], pT[2 * kk + 1]);
        dev::acc_to_a<T>(sa, dsT[2 * kk], dsT[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t ob[4], qb[4];
          const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 2 + (lane >> 4);
          dev::ldmatrix_x4_trans(ob, tile_at<D>(ts.dO, r, c));
          dev::ldmatrix_x4_trans(qb, tile_at<D>(ts.Q, r, c));
          dev::mma_n16<T>(dv[2 * dp], dv[2 * dp + 1], pa, ob);
          dev::mma_n16<T>(dk[2 * dp], dk[2 * dp + 1], sa, qb);
        }
      }
    }
  }
  // wgmma: dV, dK done (their operands' stage is reloaded after the next barrier).
  __device__ __forceinline__ static void wait_dv_dk(float (&dk)[DT][4], float (&dv)[DT][4]) {
    if constexpr (kWg) {
      dev::wgmma_wait<0>();
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[DT * 4]>(dk));
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[DT * 4]>(dv));
    }
  }

  // dS^T to shared memory: fp32 for the helper's dbias sum (once it has read the last step's),
  // 16-bit for this quad's dQ = dS K; returns when the quad's 16-bit tile is complete.
  __device__ __forceinline__ void stage_ds(const float (&dsT)[QT][4], int gs) const {
    if (k.part) {
      if (gs > 0) dev::bar_sync(kBarDsFree, B::kWith);
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(qdSf + krow[r] * FS + nt * 8 + 2 * t) = make_float2(dsT[nt][2 * r], dsT[nt][2 * r + 1]);
      dev::bar_arrive(kBarDoneB, B::kWith);
    }
#pragma unroll
    for (int nt = 0; nt < QT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(tile_at<BQ>(qdS, krow[r], nt) + 2 * t) = Mma::pack(dsT[nt][2 * r], dsT[nt][2 * r + 1]);
    dev::bar_sync(kBarQuad + quad, 128);
  }

  // A slice group's last step: dK = scale * dS^T Q and dV of this slice to global memory.
  __device__ __forceinline__ void write_dk_dv(const float (&dk)[DT][4], const float (&dv)[DT][4], int s) const {
    T* gdK = slice_ptr_mut<T>(a.dk, k.b, s, k.h);
    T* gdV = slice_ptr_mut<T>(a.dv, k.b, s, k.h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = k.k0 + krow[r];
      if (key >= k.N) continue;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int d = dt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(gdK + key * a.dk.sn + d) = Mma::pack(dk[dt][2 * r] * a.scale, dk[dt][2 * r + 1] * a.scale);
        *reinterpret_cast<uint32_t*>(gdV + key * a.dv.sn + d) = Mma::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }

  __device__ __forceinline__ void dq_part(const T* qK, float* tDq) const;
};

}  // namespace
}  // namespace tpf::attn

#include "attention/backward_dq_part.cuh"
