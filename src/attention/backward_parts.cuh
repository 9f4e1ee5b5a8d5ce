// The math warps' parts of the attention backward (backward.cu's run_math strings them
// together, a step at a time): the score products, the score modifier with the probability
// recompute, the gradient products, the dS^T stores, the dQ part and the dK, dV epilogue.
//
// A math warp owns 16 keys of the block's BK-key tile; thread (g = lane / 4, t = lane % 4)
// holds keys krow[0] = 16 wq + g and krow[1] = 16 wq + g + 8 of it. Fragments [QT][4]: n8 tile
// nt of the step's BQ queries, element e at key krow[e / 2], query 8 nt + 2 t + e % 2 (the
// mma.sync accumulator layout, which wgmma's m64 accumulators share a warp at a time).
#pragma once
#include "common/wgmma.cuh"
#include "attention/tile_io.cuh"

namespace tpf::attn {
namespace {

// One step's shared tiles as a quad reads them (16-bit [rows][D] tiles, swizzle<D>).
template <class T>
struct StepTiles {
  const T* K;            // [BK][D]  this quad's slice
  const T* V;            // [BK][D]
  const T* Q;            // [BQ][D]
  const T* dO;           // [BQ][D]
  const float* lse;      // [BQ]     LSE * log2(e)
  const float* dlt;      // [BQ]     Dlt
  const uint8_t* bias;   // [BQ][BK] BiasTile layout
};

// S^T = K Q^T and dP^T = V dO^T: 16 keys x BQ queries per warp. wgmma (kWg): the quad's 64
// keys in one warpgroup, K, V, Q, dO K-major from the 64-byte-swizzled tiles (descK .. descO:
// a k16 step is + 2).
template <class T, int D, int BQ, bool kWg>
__device__ __forceinline__ void score_products(float (&sT)[BQ / 8][4], float (&dpT)[BQ / 8][4],
                                               const StepTiles<T>& st, uint64_t descK, uint64_t descV,
                                               uint64_t descQ, uint64_t descO, int wq, int lane) {
  constexpr int QT = BQ / 8, KS = D / 16;
  if constexpr (kWg) {
    float(&s_flat)[QT * 4] = reinterpret_cast<float(&)[QT * 4]>(sT);
    float(&dp_flat)[QT * 4] = reinterpret_cast<float(&)[QT * 4]>(dpT);
    dev::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      dev::WgmmaSS<T, BQ, 0, 0>::run(s_flat, descK + 2 * ks, descQ + 2 * ks, ks > 0);
      dev::WgmmaSS<T, BQ, 0, 0>::run(dp_flat, descV + 2 * ks, descO + 2 * ks, ks > 0);
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
      uint32_t ka[4], va[4];  // A fragments: 16 keys x k16
      dev::ldmatrix_x4(ka, tile_at<D>(st.K, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 2 + (lane >> 4)));
      dev::ldmatrix_x4(va, tile_at<D>(st.V, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 2 + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < QT / 2; ++np) {
        uint32_t qb[4], ob[4];  // B fragments: k16 x 16 queries
        const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
        dev::ldmatrix_x4(qb, tile_at<D>(st.Q, r, c));
        dev::ldmatrix_x4(ob, tile_at<D>(st.dO, r, c));
        dev::mma_n16<T>(sT[2 * np], sT[2 * np + 1], ka, qb);
        dev::mma_n16<T>(dpT[2 * np], dpT[2 * np + 1], va, ob);
      }
    }
  }
}

// The score modifier and the probabilities, in place: P^T = exp2((S^T scale + bias) log2(e) -
// LSE log2(e)), 0 at masked keys; dS^T = P^T (dP^T - Dlt). A 16-bit bias comes by
// ldmatrix.x4.trans (n8 tiles nt, nt + 1 at even nt), except at D = 128, whose registers are
// all taken (the extra four spill).
template <class T, class BiasT, int D, int BQ, int BK>
__device__ __forceinline__ void probabilities(float (&sT)[BQ / 8][4], float (&dpT)[BQ / 8][4], const StepTiles<T>& st,
                                              const bool (&attend)[2], const int (&krow)[2], float scale,
                                              int wq, int lane) {
  constexpr int QT = BQ / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr bool kBiasX4 = sizeof(BiasT) == 2 && D <= 64;
  const int t = lane % 4;
  uint32_t bp[4];  // bias pairs of n8 tiles nt, nt + 1
#pragma unroll
  for (int nt = 0; nt < QT; ++nt) {
    if constexpr (kBiasX4) {
      using X4 = BiasX4Trans<BiasT, BQ, BK>;
      if (nt % 2 == 0) X4::load(bp, dev::smem_addr(st.bias) + X4::offset(wq * 16, lane) + nt * 8 * X4::kColStep);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2, q = nt * 8 + 2 * t + (e & 1);
      float bias;
      if constexpr (kBiasX4) {
        const float2 pair = dev::pair_to_float2<BiasT>(bp[2 * (nt % 2) + r]);
        bias = e & 1 ? pair.y : pair.x;
      } else {
        bias = bias_at<BiasT, BQ, BK>(st.bias, q, krow[r]);
      }
      const float x = fmaf(fmaf(sT[nt][e], scale, bias), kLog2e, -st.lse[q]);
      const float p = attend[r] ? dev::exp2_approx(x) : 0.f;
      sT[nt][e] = p;
      dpT[nt][e] = p * (dpT[nt][e] - st.dlt[q]);
    }
  }
}

// dV += P^T dO and dK += dS^T Q, 16-bit P^T and dS^T as A operands straight from registers.
// wgmma: issued here and left running (the caller waits after the dQ part); Q and dO MN-major
// (a k16 step of queries is + 64 in descQ, descO).
template <class T, int D, int BQ, bool kWg>
__device__ __forceinline__ void gradient_products(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                                  const float (&pT)[BQ / 8][4], const float (&dsT)[BQ / 8][4],
                                                  const StepTiles<T>& st, uint64_t descQ, uint64_t descO,
                                                  int lane) {
  constexpr int DT = D / 8;
  if constexpr (kWg) {
    float(&dk_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(dk);
    float(&dv_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(dv);
    uint32_t pa[BQ / 16][4], sa[BQ / 16][4];  // [k16 step] A fragments, unchanged until the wait
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      dev::acc_to_a<T>(pa[kk], pT[2 * kk], pT[2 * kk + 1]);
      dev::acc_to_a<T>(sa[kk], dsT[2 * kk], dsT[2 * kk + 1]);
    }
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      dev::WgmmaN32RS<T, 1>::run(dv_flat, pa[kk], descO + 64 * kk, 1);
      dev::WgmmaN32RS<T, 1>::run(dk_flat, sa[kk], descQ + 64 * kk, 1);
    }
    dev::wgmma_commit();
  } else {
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      uint32_t pa[4], sa[4];  // A fragments: 16 keys x k16 queries
      dev::acc_to_a<T>(pa, pT[2 * kk], pT[2 * kk + 1]);
      dev::acc_to_a<T>(sa, dsT[2 * kk], dsT[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t ob[4], qb[4];  // B fragments: k16 queries x 16 d
        const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 2 + (lane >> 4);
        dev::ldmatrix_x4_trans(ob, tile_at<D>(st.dO, r, c));
        dev::ldmatrix_x4_trans(qb, tile_at<D>(st.Q, r, c));
        dev::mma_n16<T>(dv[2 * dp], dv[2 * dp + 1], pa, ob);
        dev::mma_n16<T>(dk[2 * dp], dk[2 * dp + 1], sa, qb);
      }
    }
  }
}

// dS^T into the quad's fp32 tile qdSf [BK][FS] (the helper's dbias sum).
template <int BQ, int FS>
__device__ __forceinline__ void store_ds_f32(float* qdSf, const float (&dsT)[BQ / 8][4], const int (&krow)[2],
                                             int t) {
#pragma unroll
  for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(qdSf + krow[r] * FS + nt * 8 + 2 * t) = make_float2(dsT[nt][2 * r], dsT[nt][2 * r + 1]);
}

// dS^T into the quad's 16-bit tile qdS [BK][BQ] (swizzle<BQ>), the dQ part's operand.
template <class T, int BQ>
__device__ __forceinline__ void store_ds_16(T* qdS, const float (&dsT)[BQ / 8][4], const int (&krow)[2], int t) {
#pragma unroll
  for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<uint32_t*>(tile_at<BQ>(qdS, krow[r], nt) + 2 * t) =
          dev::MmaOp<T>::pack(dsT[nt][2 * r], dsT[nt][2 * r + 1]);
}

// This key tile's dQ part, dS (BQ x BK) K (BK x D), from the quad's complete dS^T tile into
// tDq [BQ][DP], in 16 x 16 units: unit wq + 4 u of warp wq.
template <class T, int D, int BQ, int BK, int DP>
__device__ __forceinline__ void dq_part(float* tDq, const T* qdS, const T* qK, int wq, int lane) {
  constexpr int kUnits = (BQ / 16) * (D / 16) / 4;  // units a warp (0 at D = 16: warps 0, 1 take one)
  const int g = lane / 4, t = lane % 4;
  if constexpr (kUnits >= 4) {
    // D = 128: a warp's four units share their 16 query rows, so one dS fragment a k16 step
    // serves all four: fwd+bwd -8.6 / -9.7% at N = 384 / 768. With two units a warp (D = 32,
    // 64) the unit-by-unit loop below, reloading it, measured faster (perf-notes v16).
    static_assert(BQ / 16 == 2, "four units a warp: unit % (BQ / 16) == wq % 2");
    const int qg = wq % 2;
    float dq[kUnits][2][4] = {};  // [unit][n8 half][fragment]: 16 queries x 16 d a unit
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t sa[4];
      dev::ldmatrix_x4_trans(sa, tile_at<BQ>(qdS, kk * 16 + (lane & 7) + ((lane >> 4) << 3), qg * 2 + ((lane >> 3) & 1)));
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        uint32_t kb4[4];
        dev::ldmatrix_x4_trans(kb4, tile_at<D>(qK, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                               (wq + 4 * u) / 2 * 2 + (lane >> 4)));
        dev::mma_n16<T>(dq[u][0], dq[u][1], sa, kb4);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(tDq + (qg * 16 + g + 8 * r) * DP + (wq + 4 * u) / 2 * 16 + n * 8 + 2 * t) =
              make_float2(dq[u][n][2 * r], dq[u][n][2 * r + 1]);
  } else if (kUnits > 0 || wq < (BQ / 16) * (D / 16)) {
#pragma unroll
    for (int u = 0; u < (kUnits > 0 ? kUnits : 1); ++u) {
      const int unit = wq + 4 * u, qg = unit % (BQ / 16), dg = unit / (BQ / 16);
      float dq[2][4] = {};  // [n8 half][fragment]: 16 queries x 16 d
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t sa[4], kb4[4];
        dev::ldmatrix_x4_trans(sa, tile_at<BQ>(qdS, kk * 16 + (lane & 7) + ((lane >> 4) << 3), qg * 2 + ((lane >> 3) & 1)));
        dev::ldmatrix_x4_trans(kb4, tile_at<D>(qK, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dg * 2 + (lane >> 4)));
        dev::mma_n16<T>(dq[0], dq[1], sa, kb4);
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(tDq + (qg * 16 + g + 8 * r) * DP + dg * 16 + n * 8 + 2 * t) =
              make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
    }
  }
}

// A slice group's last step: dK = scale dS^T Q and dV of the warp's 16 keys, 16-bit, to global
// rows gdK, gdV (sn apart) of key tile k0 (keys past N skipped).
template <class T, int D>
__device__ __forceinline__ void store_dk_dv(T* gdK, int64_t dk_sn, T* gdV, int64_t dv_sn, const float (&dk)[D / 8][4],
                                            const float (&dv)[D / 8][4], float scale, int k0, int N,
                                            const int (&krow)[2], int t) {
  using Mma = dev::MmaOp<T>;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + krow[r];
    if (key >= N) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int d = dt * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(gdK + key * dk_sn + d) = Mma::pack(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(gdV + key * dv_sn + d) = Mma::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

}  // namespace
}  // namespace tpf::attn
