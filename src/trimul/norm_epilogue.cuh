// LayerNorm backward fused into the epilogue of the product that makes its input gradient,
// d xhat = dY Wᵀ (times gamma): when one 128-column tile holds whole rows (W <= kBlockN), the
// tile's rows give d x = rstd (g - mean(g) - xhat mean(g xhat)) with g = d xhat * gamma
// directly, and d xhat never goes to device memory (it used to be written in fp32 and read
// back by a row kernel: 2 x 4 bytes per element of traffic and a launch saved). The same pass
// sums the LayerNorm parameters' gradients, d gamma = sum d xhat * xhat and d beta = sum d xhat,
// per tile from the fp32 d xhat: taken through the folded weights' G (sum_o W[o][c] G[o][c]),
// they lost digits to the cancellation in that sum (d gamma_in was the worst weight gradient).
//
// Rows are walked as in the row kernels (row_math.cuh): 8 lanes per row, 32 groups over the
// tile's 128 rows, group q taking rows q, q + 32, q + 64, q + 96. The tile reads at(r, 4 (l8 +
// 8u) + e) hit banks r + 4 l8 + e: the four consecutive rows of a warp and its 8 lanes cover
// the 32 banks once.
#pragma once
#include "trimul/epilogues.cuh"
#include "common/row_math.cuh"

namespace tpf::trimul {

struct NormRowWalk {
  static constexpr int kGroups = Cfg::kThreads / rows::kGroupLanes;
  static constexpr int kRows = Cfg::kBlockM / kGroups;  // rows per group
  static constexpr int kUnits = Cfg::kBlockN / 32;      // 4-channel units per lane
  static constexpr int kVals = 4 * kUnits;
  int grp, l8;
  __device__ NormRowWalk() : grp(threadIdx.x / rows::kGroupLanes), l8(threadIdx.x % rows::kGroupLanes) {}
  __device__ int row(int k) const { return grp + kGroups * k; }
  __device__ int channel(int u) const { return rows::unit_channel(l8, u); }
  // gamma at this lane's channels (zero past W).
  __device__ void load_gamma(float (&gm)[kVals], const WeightRef& gamma, int W) const {
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) gm[4 * u + e] = u < W / 32 ? weight_at(gamma, 0, channel(u) + e) : 0.f;
  }
  // g = tile row r * gamma, then d x in place (xh: the row's xhat at this lane's channels).
  // Also accumulates the LayerNorm parameters' gradients over the lane's rows: d gamma += d xhat
  // * xhat and d beta += d xhat, with d xhat the tile's value (before gamma).
  __device__ void backward(const EpiTile& t, int r, const float (&gm)[kVals], const float (&xh)[kVals],
                           float (&g)[kVals], int W, float rstd, float (&dgamma)[kVals],
                           float (&dbeta)[kVals]) const {
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = u < W / 32 ? t.at(r, channel(u) + e) : 0.f;
        dgamma[4 * u + e] += v * xh[4 * u + e];
        dbeta[4 * u + e] += v;
        g[4 * u + e] = v * gm[4 * u + e];
      }
    rows::norm_backward(g, xh, W, rstd);
  }
  // The tile's column totals of d gamma and d beta, summed over the 32 row groups in order
  // through `red` (2 x 32 x 128 floats: the extra area), into out[0, W) and out[W, 2W) (the
  // tile's slot of [m-tiles][2W] partials). Every thread must call it; synchronises.
  __device__ void column_totals(float* red, const float (&dgamma)[kVals], const float (&dbeta)[kVals], int W,
                                float* out) const {
    static_assert(2 * kGroups * Cfg::kBlockN * 4 <= Cfg::kEpiExtraBytes, "fits the extra area");
    static_assert(Cfg::kThreads == 2 * Cfg::kBlockN, "one thread per (quantity, channel)");
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        red[grp * Cfg::kBlockN + channel(u) + e] = dgamma[4 * u + e];
        red[(kGroups + grp) * Cfg::kBlockN + channel(u) + e] = dbeta[4 * u + e];
      }
    __syncthreads();
    const int q = threadIdx.x / Cfg::kBlockN, c = threadIdx.x % Cfg::kBlockN;
    float sum = 0.f;
#pragma unroll 8
    for (int k = 0; k < kGroups; ++k) sum += red[(q * kGroups + k) * Cfg::kBlockN + c];
    if (c < W) out[q * W + c] = sum;
  }
};

// Four bf16 channels as raw bits (one 8-byte load where aligned: a strided view may not be).
__device__ __forceinline__ uint2 load4_raw(const __nv_bfloat16* src) {
  if (rows::aligned8(src)) return *reinterpret_cast<const uint2*>(src);
  const auto* h = reinterpret_cast<const unsigned short*>(src);
  return make_uint2(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16));
}

// LayerNorm_in: z and dz pixel-major (any pixel strides), W = C; dz (Tdz: bf16 or fp32) plus
// dz_in where given (a residual's gradient around the update, read before dz's store: it may be
// dz itself).
template <class Tdz>
struct NormRowsBackwardEpilogue {
  Dims d;
  WeightRef gamma;  // [C]
  const float *mean, *rstd;
  PairRef z;          // bf16
  PairRef dz, dz_in;  // Tdz; dz_in.ptr nullptr: nothing added
  float* param_part;  // [m-tiles][2C]: d gamma then d beta of the tile's rows
  __device__ void operator()(const EpiTile& t, int64_t m0, int, int) const {
    const NormRowWalk w;
    const int W = static_cast<int>(d.C);
    float gm[NormRowWalk::kVals];  // [4u + e]
    w.load_gamma(gm, gamma, W);
    const auto* zp = static_cast<const __nv_bfloat16*>(z.ptr);
    auto* dzp = static_cast<Tdz*>(dz.ptr);
    const auto* addp = static_cast<const Tdz*>(dz_in.ptr);
    constexpr int kR = NormRowWalk::kRows, kU = NormRowWalk::kUnits;
    // Rows in pairs, each pair's z rows and statistics in flight before their first use (one
    // dependent load per row at a time left the epilogue latency-bound; all four rows at once
    // spilled beside the parameter-gradient sums).
    constexpr int kB = 2;
    float dgamma[NormRowWalk::kVals] = {}, dbeta[NormRowWalk::kVals] = {};  // over the lane's rows
#pragma unroll
    for (int k0 = 0; k0 < kR; k0 += kB) {
      uint2 zr[kB][kU];  // [row][unit] 4 raw bf16 channels
      float mu[kB], rs[kB];
#pragma unroll
      for (int k = 0; k < kB; ++k) {
        const int64_t m = m0 + w.row(k0 + k);
        const bool in = m < d.M();
        const __nv_bfloat16* src = zp + (in ? pair_offset(z, m, d.N) : 0);
        mu[k] = in ? mean[m] : 0.f, rs[k] = in ? rstd[m] : 0.f;
#pragma unroll
        for (int u = 0; u < kU; ++u) zr[k][u] = in && u < W / 32 ? load4_raw(src + w.channel(u)) : make_uint2(0, 0);
        // dz_in's row toward L2 now, read after the row's math: lane l8 its 128-byte line l8 (a
        // row of 128 fp32 channels is four lines), no registers held meanwhile
        constexpr size_t kLine = 128 / sizeof(Tdz);  // elements of a line
        if (addp && in && w.l8 * kLine < W) dev::prefetch_l2(addp + pair_offset(dz_in, m, d.N) + w.l8 * kLine);
      }
#pragma unroll
      for (int k = 0; k < kB; ++k) {
        const int64_t m = m0 + w.row(k0 + k);
        float xh[NormRowWalk::kVals], g[NormRowWalk::kVals];  // rows past M: zeros, join the shuffles
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const float2 lo = dev::pair_to_float2<__nv_bfloat16>(zr[k][u].x),
                       hi = dev::pair_to_float2<__nv_bfloat16>(zr[k][u].y);
          xh[4 * u] = (lo.x - mu[k]) * rs[k], xh[4 * u + 1] = (lo.y - mu[k]) * rs[k];
          xh[4 * u + 2] = (hi.x - mu[k]) * rs[k], xh[4 * u + 3] = (hi.y - mu[k]) * rs[k];
        }
        w.backward(t, w.row(k0 + k), gm, xh, g, W, rs[k], dgamma, dbeta);
        if (m >= d.M()) continue;
        Tdz* dst = dzp + pair_offset(dz, m, d.N);
        // dz_in after the row's math: held across its shuffles it spilled (128 registers)
        if (addp) {
          const Tdz* src = addp + pair_offset(dz_in, m, d.N);
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            float add[4];  // dz_in at channels channel(u) .. + 3
            if (u < W / 32) rows::load4(add, src + w.channel(u), rows::aligned4(src));
#pragma unroll
            for (int e = 0; e < 4; ++e) g[4 * u + e] += u < W / 32 ? add[e] : 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u)
          if (u < W / 32) rows::store4(dst + w.channel(u), g + 4 * u, rows::aligned4(dst));
      }
    }
    w.column_totals(static_cast<float*>(t.extra), dgamma, dbeta, W, param_part + (m0 / Cfg::kBlockM) * 2 * W);
  }
};

// LayerNorm_out: x and dx channel-major bf16, W = Ch; needs N % 8 == 0 (8-pixel groups never
// straddle a matrix row and there are no pads). x's tile is staged in the extra area as
// [channel][128 pixels] bf16 with pixel groups of 8 swizzled by channel / 4: the rows' reads
// (pixel r, channel 4 (l8 + 8u) + e) then land in bank ((r / 2) ^ 4 l8) % 32, all distinct for
// a warp's four rows and eight lanes (pixel pairs share a word: broadcast).
struct NormChannelMajorBackwardEpilogue {
  Dims d;
  WeightRef gamma;  // [Ch]
  const float *mean, *rstd;
  const __nv_bfloat16* x;
  __nv_bfloat16* dx;
  float* param_part;  // [m-tiles][2Ch]: d gamma then d beta of the tile's rows
  static constexpr int kGroups8 = Cfg::kBlockM / 8;  // 8-pixel groups of the tile

  __device__ static int swizzled(int c, int p) { return c * Cfg::kBlockM + (p ^ (((c >> 2) & 7) << 3)); }

  __device__ void operator()(const EpiTile& t, int64_t m0, int, int) const {
    const int W = static_cast<int>(d.Ch);
    auto* xs = static_cast<__nv_bfloat16*>(t.extra);  // [W][128] swizzled
    const int64_t plane = d.plane();
    // Stage x: thread (8-pixel group q, channel c): one 16-byte load of 8 pixels.
    {
      constexpr int kStep = Cfg::kThreads / kGroups8, kLoads = Cfg::kBlockN / kStep;
      const int q = threadIdx.x % kGroups8, c0 = threadIdx.x / kGroups8;
      const int64_t m = m0 + 8 * q;
      const int64_t base = m < d.M() ? cm_offset(d, m, 0) : 0;
      uint4 v[kLoads];  // [load]: all in flight before the first store
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int c = c0 + kStep * i;
        v[i] = m < d.M() && c < W ? *reinterpret_cast<const uint4*>(x + base + c * plane) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kLoads; ++i)
        if (c0 + kStep * i < W) *reinterpret_cast<uint4*>(xs + swizzled(c0 + kStep * i, 8 * q)) = v[i];
    }
    __syncthreads();
    const NormRowWalk w;
    float gm[NormRowWalk::kVals];  // [4u + e]
    w.load_gamma(gm, gamma, W);
    float dgamma[NormRowWalk::kVals] = {}, dbeta[NormRowWalk::kVals] = {};  // over the lane's rows
#pragma unroll
    for (int k = 0; k < NormRowWalk::kRows; ++k) {
      const int r = w.row(k);
      const int64_t m = m0 + r;
      const bool in = m < d.M();
      const float mu = in ? mean[m] : 0.f, rs = in ? rstd[m] : 0.f;
      float xh[NormRowWalk::kVals] = {}, g[NormRowWalk::kVals];
#pragma unroll
      for (int u = 0; u < NormRowWalk::kUnits; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (in && u < W / 32) xh[4 * u + e] = (__bfloat162float(xs[swizzled(w.channel(u) + e, r)]) - mu) * rs;
      w.backward(t, r, gm, xh, g, W, rs, dgamma, dbeta);
      // d x replaces the gradient in place: only this lane reads these elements before the sync.
#pragma unroll
      for (int u = 0; u < NormRowWalk::kUnits; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (u < W / 32) t.at(r, w.channel(u) + e) = g[4 * u + e];
    }
    __syncthreads();  // x's staging is dead: the extra area takes the column totals' reduction
    w.column_totals(static_cast<float*>(t.extra), dgamma, dbeta, W, param_part + (m0 / Cfg::kBlockM) * 2 * W);
    // Store: a warp takes 8 channels x 4 pixel groups (lane = 4 channel + group): reads
    // at(8 q + e, c) hit banks 8 q + c + e, distinct over the warp; each channel gets 64
    // contiguous bytes. Every thread keeps one pixel group, so its offset is computed once.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q = 4 * (warp % 4) + lane % 4;
    const int64_t m = m0 + 8 * q;
    if (m >= d.M()) return;
    const int64_t base = cm_offset(d, m, 0);
    for (int c = 8 * (warp / 4) + lane / 4; c < W; c += 8 * (Cfg::kThreads / 32 / 4)) {
      float v[8];  // [pixel]
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = t.at(8 * q + e, c);
      *reinterpret_cast<uint4*>(dx + base + c * plane) = dev::pack8<__nv_bfloat16>(v);
    }
  }
};

}  // namespace tpf::trimul
