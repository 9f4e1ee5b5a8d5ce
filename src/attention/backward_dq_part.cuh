// The math warps' dQ part of a key tile (backward_math.cuh): dQ = dS (BQ x BK) K (BK x D), in
// 16 x 16 units of [query rows][d] per warp, from the quad's 16-bit dS^T tile and its K tile in
// shared memory, to the fp32 [BQ][kDqPitch] tile the helper's dQ warps add in key-tile order.
#pragma once

namespace tpf::attn {
namespace {

template <class T, class BiasT, int D, int C>
__device__ __forceinline__ void BwdMath<T, BiasT, D, C>::dq_part(const T* qK, float* tDq) const {
  constexpr int kDqUnits = (BQ / 16) * (D / 16) / 4;  // 16x16 blocks of dQ per warp (0 at D=16)
  constexpr int kDqUnitsPerWarp = kDqUnits > 0 ? kDqUnits : 1;
  constexpr int DP = L::kDqPitch;
  if constexpr (kDqUnitsPerWarp >= 4) {
    // D = 128: a warp's four units (wq + 4u) share their 16 query rows, so one dS fragment a k16
    // step serves all four: fwd+bwd -8.6 / -9.7% at N = 384 / 768. With two units a warp (D = 32,
    // 64) the unit-by-unit loop below, reloading it, measured faster (D = 32: 6.27 vs 6.52 ms;
    // perf-notes v16).
    constexpr int U = kDqUnitsPerWarp;
    static_assert(BQ / 16 == 2, "four units a warp: unit % (BQ / 16) == wq % 2");
    const int qg = wq % 2;
    float dq[U][2][4] = {};  // [unit][n8 half][fragment]: 16 queries x 16 d a unit
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t sa[4];
      dev::ldmatrix_x4_trans(sa, tile_at<BQ>(qdS, kk * 16 + (lane & 7) + ((lane >> 4) << 3), qg * 2 + ((lane >> 3) & 1)));
#pragma unroll
      for (int u = 0; u < U; ++u) {
        uint32_t kb4[4];
        dev::ldmatrix_x4_trans(kb4, tile_at<D>(qK, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                               (wq + 4 * u) / 2 * 2 + (lane >> 4)));
        dev::mma_n16<T>(dq[u][0], dq[u][1], sa, kb4);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(tDq + (qg * 16 + g + 8 * r) * DP + (wq + 4 * u) / 2 * 16 + n * 8 + 2 * t) =
              make_float2(dq[u][n][2 * r], dq[u][n][2 * r + 1]);
  } else if (kDqUnits > 0 || wq < (BQ / 16) * (D / 16)) {
#pragma unroll
    for (int u = 0; u < kDqUnitsPerWarp; ++u) {
      const int unit = wq + 4 * u, qg = unit % (BQ / 16), dg = unit / (BQ / 16);
      float dq[2][4] = {};  // [n8 half][fragment]
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

}  // namespace
}  // namespace tpf::attn
