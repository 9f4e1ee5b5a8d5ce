// The attention forward's math parts (forward.cu), per warp of 16 query rows (wgmma: per
// warpgroup of 64) and key tile of BK: the products S = mask + QK^T and O += PV (FwdMma), the
// pair-bias score modifier (add_pair_bias), the online softmax (OnlineSoftmax) and the epilogue
// (write_outputs). Accumulators are in mma.sync's C layout: thread (g = lane / 4, t = lane % 4)
// holds rows g, g + 8 and columns 2t, 2t + 1 of every n8 tile (wgmma's is the same per warp).
#pragma once
#include "attention/forward_tiles.cuh"

namespace tpf::attn {
namespace {

template <class T, class BiasT, int D, bool kTma>
struct FwdMma {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  static constexpr int BK = Cfg::kBlockK, NT = BK / 8, DT = D / 8, KS = D / 16;
  static constexpr bool kWgmma = fwd_wgmma<BiasT, D>();
  static_assert(!kWgmma || Cfg::kStages == 2, "the previous tile's stage is stage ^ 1");
  using Mma = dev::MmaOp<T>;
  const int warp, lane;
  // Row sums of P come out of the tensor cores: P times a column of ones (B fragment: column 0
  // of the n-tile is 1, the rest 0), so lsum[0] / lsum[2] of lane t = 0 hold rows g / g + 8.
  const uint32_t ones;
  uint32_t qa[kWgmma ? 1 : KS][4];  // Q rows of this warp as A fragments (mma.sync)
  // This lane's byte offset in a K tile for each k16 step's ldmatrix (rows np * 16 + its row
  // share its swizzle): computed once, so the loop adds only the stage and immediates.
  uint32_t k_off[KS];
  // wgmma operands: Q and K K-major, V MN-major, in 64-byte-swizzled tiles (rows of D = 32
  // elements: common/swizzle.cuh's pattern is the hardware's); a k16 step is 32 bytes along a
  // row (Q, K) or 16 rows (V).
  const uint64_t q_desc0, k_desc0, v_desc0;
  // wgmma: P of the previous tile, packed; its PV runs on the tensor cores during this tile's
  // bias, mask and softmax work (issued with this tile's QK^T, waited for before the rescale).
  uint32_t pa_prev[kWgmma ? BK / 16 : 1][4];

  __device__ __forceinline__ FwdMma(const T* sQ, const T* sK, const T* sV, int warp_, int lane_)
      : warp(warp_), lane(lane_), ones((lane_ / 4) == 0 ? Mma::pack(1.f, 1.f) : 0u),
        q_desc0(dev::wgmma_desc_rows32(dev::smem_addr(sQ))), k_desc0(dev::wgmma_desc_rows32(dev::smem_addr(sK))),
        v_desc0(dev::wgmma_desc_rows32(dev::smem_addr(sV))) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      k_off[ks] = 2 * dev::tile_offset<D>((lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1));
  }
  __device__ __forceinline__ uint64_t q_desc(int ks) const { return dev::wgmma_desc_advance(q_desc0, 32 * ks); }
  __device__ __forceinline__ uint64_t k_desc(int st, int ks) const {
    return dev::wgmma_desc_advance(k_desc0, st * BK * D * 2 + 32 * ks);
  }
  __device__ __forceinline__ uint64_t v_desc(int st, int kk) const {
    return dev::wgmma_desc_advance(v_desc0, (st * BK + kk * 16) * D * 2);
  }

  // mma.sync: the warp's Q rows into A fragments, once the Q tile has landed.
  __device__ __forceinline__ void load_q(const T* sQ) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      dev::ldmatrix_x4(qa[ks], tile_at<D>(sQ, warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ks * 2 + (lane >> 4)));
  }

  // sc (holding the key mask) += QK^T of the tile in `stage`. wgmma: issued asynchronously with
  // the previous tile's PV (j > 0), both waited for by wait_scores / wait_pv; the loads issued
  // next then cover the products' latency.
  __device__ __forceinline__ void scores(float (&sc)[NT][4], float (&o_flat)[DT * 4], int stage, int j,
                                         uint32_t tK) const {
    if constexpr (kWgmma) {
      float(&s_flat)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(sc);
      dev::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        if constexpr (BK == 128) dev::Wgmma<T, 0, 0>::run(s_flat, q_desc(ks), k_desc(stage, ks), 1);
        else dev::WgmmaSS<T, BK, 0, 0>::run(s_flat, q_desc(ks), k_desc(stage, ks), 1);
      }
      dev::wgmma_commit();
      if (j > 0) {
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) dev::WgmmaN32RS<T, 1>::run(o_flat, pa_prev[kk], v_desc(stage ^ 1, kk), 1);
      }
      dev::wgmma_commit();
    } else {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t kb[4];
          dev::ldmatrix_x4(kb, tK + k_off[ks] + np * 16 * D * 2);
          dev::mma_n16<T>(sc[2 * np], sc[2 * np + 1], qa[ks], kb);
        }
    }
  }
  // wgmma: QK^T done (the previous tile's PV may still run).
  __device__ __forceinline__ static void wait_scores(float (&sc)[NT][4]) {
    if constexpr (kWgmma) {
      dev::wgmma_wait<1>();
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[NT * 4]>(sc));
    }
  }
  // wgmma: the previous tile's PV done, after the exponentials (pinned by the register fence:
  // the compiler may otherwise move them past the wait), before O is rescaled.
  __device__ __forceinline__ static void wait_pv(float (&p)[NT][4], float (&o_flat)[DT * 4]) {
    if constexpr (kWgmma) {
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[NT * 4]>(p));
      dev::wgmma_wait<0>();
      dev::wgmma_fence_operands(o_flat);
    }
  }

  // O += P V and lsum += P 1, P straight from registers as the A operand. wgmma: P is packed
  // for the PV issued with the next tile's QK^T (or by finish).
  __device__ __forceinline__ void pv(const float (&p)[NT][4], float (&o)[DT][4], float (&lsum)[4], const T* tV) {
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      if constexpr (kWgmma) {
        dev::acc_to_a<T>(pa_prev[kk], p[2 * kk], p[2 * kk + 1]);
        Mma::run(lsum, pa_prev[kk], ones, ones);
      } else {
        uint32_t pa[4];
        dev::acc_to_a<T>(pa, p[2 * kk], p[2 * kk + 1]);
        Mma::run(lsum, pa, ones, ones);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          dev::ldmatrix_x4_trans(vb, tile_at<D>(tV, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dp * 2 + (lane >> 4)));
          dev::mma_n16<T>(o[2 * dp], o[2 * dp + 1], pa, vb);
        }
      }
    }
  }
  // wgmma: the last tile's PV, from V in `stage` (landed: FwdLoads::wait_last_v).
  __device__ __forceinline__ void finish(float (&o_flat)[DT * 4], int stage) const {
    if constexpr (kWgmma) {
      dev::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) dev::WgmmaN32RS<T, 1>::run(o_flat, pa_prev[kk], v_desc(stage, kk), 1);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::wgmma_fence_operands(o_flat);
    }
  }
};

// Score modifier: + pair bias. 16-bit bias: s = QK^T + mask + bias / scale, by one MMA per n-tile
// (A: the warp's 16 rows x 8 keys of the bias tile, twice along k; B: 1/scale times a doubled
// identity), so that scores stay in units of scale and need no instruction of their own before
// the max. fp32 bias: s = scale (QK^T + mask) + bias per score.
template <class T, class BiasT, int D, bool kTma, int NT>
__device__ __forceinline__ void add_pair_bias(float (&sc)[NT][4], const uint8_t* tBias, const uint32_t (&unscale)[2],
                                              float scale, int warp, int lane) {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  constexpr int BQ = Cfg::kBlockQ, BK = Cfg::kBlockK;
  using BiasTma = BiasSwz128<BQ, BK, sizeof(BiasT)>;
  const int g = lane / 4, t = lane % 4;
  if constexpr (sizeof(BiasT) == 2 && kTma) {
    const uint32_t bias_addr = dev::smem_addr(tBias) + BiasTma::row_offset(warp * 16, lane);
    const uint32_t xor_bytes = (lane & 7) * 16;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t ba[4];
      dev::ldmatrix_x4(ba, bias_addr + BiasTma::chunk_offset(nt, xor_bytes));
      dev::MmaOp<T>::run(sc[nt], ba, unscale[0], unscale[1]);
    }
  } else if constexpr (sizeof(BiasT) == 2) {
    using BiasA = BiasDupA<BiasT, BQ, BK>;
    const uint32_t bias_addr = dev::smem_addr(tBias) + BiasA::offset(warp * 16, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t ba[4];
      BiasA::load(ba, bias_addr + nt * 16);
      dev::MmaOp<T>::run(sc[nt], ba, unscale[0], unscale[1]);
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int bias_row = warp * 16 + g + 8 * r, bias_key = nt * 8 + 2 * t;
        float2 bias;
        if constexpr (kTma) {
          bias = *reinterpret_cast<const float2*>(tBias + BiasTma::pair_offset(bias_row, bias_key));
        } else {
          bias = bias_pair_at<BiasT, BQ, BK>(tBias, bias_row, bias_key);
        }
        sc[nt][2 * r] = fmaf(sc[nt][2 * r], scale, bias.x);
        sc[nt][2 * r + 1] = fmaf(sc[nt][2 * r + 1], scale, bias.y);
      }
  }
}

// Online softmax in the log2 domain over the thread's two rows (r = 0: row g, 1: g + 8),
// reduced across the quad of lanes sharing a row. m: the running row max in score units.
struct OnlineSoftmax {
  float m[2] = {-INFINITY, -INFINITY};

  // Scores to exponentials in place, p = exp2(s to_log2 - m to_log2) against the updated max;
  // alpha: the factor the running sums and O take.
  template <int NT>
  __device__ __forceinline__ void exponentiate(float (&sc)[NT][4], float to_log2, float (&alpha)[2]) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(tile_max[r], fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
    float neg_base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      const float base = m_new == -INFINITY ? 0.f : m_new;  // all keys masked so far: p = 0
      alpha[r] = dev::exp2_approx((m[r] - base) * to_log2);
      neg_base[r] = -base * to_log2;
      m[r] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = dev::exp2_approx(fmaf(sc[nt][e], to_log2, neg_base[e / 2]));
  }

  template <int DT>
  __device__ __forceinline__ static void rescale(float (&o)[DT][4], float (&lsum)[4], const float (&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lsum[e] *= alpha[e / 2];
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) o[dt][e] *= alpha[e / 2];
    }
  }
};

// Epilogue: normalise, write O, its residual and the LSE. A row with every key masked has l = 0:
// its output is 0 and its LSE +inf, so the backward's P is 0 too. A NaN l leaves O NaN.
template <class T, int DT>
__device__ __forceinline__ void write_outputs(const FwdArgs& a, const float (&o)[DT][4], const float (&lsum)[4],
                                              const float (&m)[2], float unit, const int (&row)[2], int b, int s,
                                              int h, int lane) {
  const int t = lane % 4, N = a.dims.N;
  T* gO = slice_ptr_mut<T>(a.out, b, s, h);
  T* gR = a.res.ptr ? slice_ptr_mut<T>(a.res, b, s, h) : nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = __shfl_sync(0xffffffffu, lsum[2 * r], lane & ~3);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row[r] >= N) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const float o0 = o[dt][2 * r] * inv, o1 = o[dt][2 * r + 1] * inv;
      const uint32_t packed = dev::MmaOp<T>::pack(o0, o1);
      const int64_t off = row[r] * a.out.sn + dt * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(gO + off) = packed;
      if (gR) {  // R = bf16(O - float(bf16(O))): the next 8 bits of O for the backward's Dlt
        const T* rounded = reinterpret_cast<const T*>(&packed);
        const uint32_t res = dev::MmaOp<T>::pack(o0 - dev::to_float(rounded[0]), o1 - dev::to_float(rounded[1]));
        *reinterpret_cast<uint32_t*>(gR + row[r] * a.res.sn + dt * 8 + 2 * t) = res;
      }
    }
    if (t == 0) {
      const int64_t idx = ((static_cast<int64_t>(b) * a.dims.S + s) * a.dims.H + h) * N + row[r];
      // l = 0: every key masked (LSE +inf gives P = 0 in the backward); l = NaN: a non-finite
      // input reached the row, and a NaN LSE carries it into every gradient instead of hiding it.
      a.lse[idx] = l > 0.f ? m[r] * unit + logf(l) : (l == 0.f ? INFINITY : NAN);
    }
  }
}

}  // namespace
}  // namespace tpf::attn
