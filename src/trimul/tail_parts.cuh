// The parts of the fused backward tail (tail.cu): the input projection's backward and d x̂_in
// with LayerNorm_in's backward in one pass over a 128-pixel row tile (docs/trimul-design.md,
// "Backward"). A block is a producer warpgroup (one thread copies the weight tiles by TMA) and
// two consumer warpgroups, each owning 64 rows of the tile. For each 128-column tile nt of
// dlin's a/b part a consumer
//   recomputes [p | g] = x̂ Wcat_ntᵀ            (wgmma, fp16, both operands in shared memory),
//   forms dlin's high/low parts from da, db       (registers, into shared memory as the next
//                                                  A; a TMA store copies them to dlin for dW_in),
//   accumulates d x̂ += dlin_hi Wraw_nt + dlin_lo Wraw_nt   (wgmma, bf16),
// then d x̂ += dgate Wraw_gate, and LayerNorm_in's backward on the d x̂ accumulator.
// Why one kernel: dlin (1.36 GB at N = 768) is then written once and read only by dW_in, where a
// d x̂_in product would read it back (docs/perf-notes.md, eleventh session).
#pragma once
#include <cuda.h>

#include "common/tma.cuh"
#include "common/warp_roles.cuh"
#include "common/wgmma.cuh"
#include "trimul/epilogues.cuh"
#include "trimul/tail_layout.h"

namespace tpf::trimul::tail {

using bf16 = __nv_bfloat16;

constexpr int kThreads = TailTile::kThreads;  // producer warpgroup + two consumers
constexpr int kRows = TailTile::kRows;        // pixels a tile (64 a consumer)
constexpr int kMaxTiles = TailTile::kMaxColTiles;
static_assert(TailTile::kConsumers == 2 && kRows == 64 * TailTile::kConsumers,
              "the shared-memory plan below holds two consumers' tiles of 64 rows");

struct TailMaps {
  CUtensorMap xhat;   // x̂_in [rows][C] fp16 (row 0: pixel xhat_row0), boxes of 64 channels x 64 pixels
  CUtensorMap wcat;   // folded weight [P][C] fp16, boxes of 64 channels x 128 rows
  CUtensorMap wraw;   // unfolded weight [P + 4Ch][C] bf16 (dlin's row order), boxes of 64 x 64
  CUtensorMap dgate;  // the gate columns' gradient [rows][C] bf16, boxes of 64 x 64
  CUtensorMap dlin;   // [r1 - r0][P + 4Ch] bf16 (stores), boxes of 64 x 64
};

struct TailArgs {
  Dims d;
  const float* bcat;      // [P] folded input bias, wcat's order
  MaskRef mask;
  const float *da, *db;   // channel-major fp32
  float* colsum_lin;      // [m-tiles][P]: the a/b columns' per-tile sums (dlin's order)
  WeightRef gamma;        // LayerNorm_in's [C]
  const float *mean, *rstd;
  PairRef z, dz, dz_in;   // bf16 z; dz (and dz_in, nullable) in the kernel's Tdz
  float* norm_part;       // [m-tiles][2C]: d gamma then d beta of each tile's rows
  int64_t r0, r1;         // the pixel rows of this launch (r0 on a row tile)
  int64_t dgate_row0;     // the pixel of the dgate map's row 0
  int64_t xhat_row0;      // the pixel of the x̂ map's row 0
  int col_tiles;          // a/b column tiles: 4Ch / 128
};

// Shared memory from a 1024-byte aligned base. 16-bit K-major tiles are [rows][64] halves with
// rows of 128 bytes in the 128-byte swizzle (TMA's and wgmma's common layout).
struct TailSmem {
  static constexpr uint32_t kWgTile = 64 * 128 * 2;        // [64 rows][128] 16-bit, 16 KB
  static constexpr uint32_t kXhat = 0;                     // [consumer] x̂ rows
  static constexpr uint32_t kWcat = kXhat + 2 * kWgTile;   // [128 cols][128 C] fp16 K-major
  static constexpr uint32_t kWraw = kWcat + 2 * kWgTile;   // [128 k][128 C] bf16 MN-major
  static constexpr uint32_t kHi = kWraw + 2 * kWgTile;     // [consumer] dlin high parts
  static constexpr uint32_t kLo = kHi + 2 * kWgTile;       // [consumer] dlin low parts
  static constexpr uint32_t kDa = kLo + 2 * kWgTile;       // [buffer][consumer] da/db [64 ch][64 px] fp32, or dgate
  static constexpr uint32_t kBars = kDa + 4 * kWgTile;     // 8 mbarriers
  static constexpr uint32_t kGamma = kBars + 64;           // [128] fp32
  static constexpr uint32_t kBytes = kGamma + 512 + 1024;  // + the alignment of the base
  uint32_t base;
  uint8_t* ptr;
  __device__ uint32_t xhat(int c) const { return base + kXhat + c * kWgTile; }
  __device__ uint32_t hi(int c) const { return base + kHi + c * kWgTile; }
  __device__ uint32_t lo(int c) const { return base + kLo + c * kWgTile; }
  __device__ uint32_t da(int buf, int c) const { return base + kDa + (2 * buf + c) * kWgTile; }
  __device__ uint32_t bar(int i) const { return base + kBars + 8 * i; }
  // Barriers: the shared weight tiles' full / empty, each consumer's x̂ and dgate full.
  __device__ uint32_t wcat_full() const { return bar(0); }
  __device__ uint32_t wcat_empty() const { return bar(1); }
  __device__ uint32_t wraw_full() const { return bar(2); }
  __device__ uint32_t wraw_empty() const { return bar(3); }
  __device__ uint32_t xhat_full(int c) const { return bar(4 + c); }
  __device__ uint32_t dgate_full(int c) const { return bar(6 + c); }
  __device__ const float* gamma() const { return reinterpret_cast<const float*>(ptr + kGamma); }
};
static_assert(TailSmem::kBytes <= 227 * 1024, "one block per SM");

// A K-major descriptor of k16 step kk of a [rows][128] tile made of [rows][64] halves.
__device__ __forceinline__ uint64_t k_desc(uint32_t tile, uint32_t half_bytes, int kk) {
  return dev::wgmma_desc(tile + (kk / 4) * half_bytes + 32 * (kk % 4), 16, 1024);
}

// Sums v over the warp's 8 row groups (lane bits 2..4) and scatters the totals: afterwards
// v[0, N / 8) hold the totals of v[base, base + N / 8) with base = N/2 b4 + N/4 b3 + N/8 b2 of
// the lane's bits (7N/8 shuffles instead of a butterfly's 3N).
template <int N, int kMask>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[N]) {
  constexpr int kHalf = N * kMask / 32;  // the values still held, halved
  const uint32_t sel = threadIdx.x & kMask ? ~0u : 0u;
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    // a select of the two values' bits: `upper ? v[j] : v[j + half]` became an indexed read of a
    // local-memory copy of v
    const uint32_t lo = __float_as_uint(v[j]), hi = __float_as_uint(v[j + kHalf]);
    const float send = __uint_as_float((lo & sel) | (hi & ~sel)), keep = __uint_as_float((hi & sel) | (lo & ~sel));
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kMask);
  }
}
template <int N>
__device__ __forceinline__ void reduce_scatter_rows(float (&v)[N]) {
  reduce_scatter_step<N, 16>(v);
  reduce_scatter_step<N, 8>(v);
  reduce_scatter_step<N, 4>(v);
}
template <int N>
__device__ __forceinline__ int scatter_base() {
  return tail::scatter_base<N>(threadIdx.x & 31);
}

// The producer (one thread): each tile's weight tiles in the consumers' order, Wcat_nt then
// Wraw_nt for every a/b column tile, then Wraw's gate rows, each once both consumers released
// the previous one.
__device__ __forceinline__ void produce_weights(const TailMaps& m, const TailSmem& s, int64_t tiles, int col_tiles) {
  uint32_t uses_c = 0, uses_r = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
    for (int nt = 0; nt <= col_tiles; ++nt) {
      if (nt < col_tiles) {
        dev::mbar_wait(s.wcat_empty(), (uses_c++ & 1) ^ 1);
        dev::mbar_arrive_expect_tx(s.wcat_full(), 2 * TailSmem::kWgTile);
        for (int h = 0; h < 2; ++h)
          dev::tma_load_3d(s.base + TailSmem::kWcat + h * TailSmem::kWgTile, &m.wcat, s.wcat_full(), 64 * h, 128 * nt, 0);
      }
      dev::mbar_wait(s.wraw_empty(), (uses_r++ & 1) ^ 1);
      dev::mbar_arrive_expect_tx(s.wraw_full(), 2 * TailSmem::kWgTile);
      for (int kb = 0; kb < 2; ++kb)
        for (int nh = 0; nh < 2; ++nh)
          dev::tma_load_3d(s.base + TailSmem::kWraw + kb * TailSmem::kWgTile + nh * (TailSmem::kWgTile / 2), &m.wraw,
                           s.wraw_full(), 64 * nh, 128 * nt + 64 * kb, 0);
    }
}

// da/db of column tile nt's 64 channels for the consumer's 64 pixels from mw, by cp.async into
// [64 ch][64 px] (da_index). Needs N % 8 == 0: a 4-pixel chunk never straddles a matrix row. Rows
// past r1 read as zero.
__device__ __forceinline__ void load_da(const TailArgs& a, uint32_t dst, int nt, int64_t mw) {
  const int tid = threadIdx.x % 128, q = tid % 16, c0 = tid / 16;  // 4-pixel chunk, first channel
  const int64_t m = mw + 4 * q;
  const bool in = m < a.r1;
  const int64_t at = in ? cm_offset(a.d, m, 0) : 0, plane = a.d.plane();
  const int Ch = static_cast<int>(a.d.Ch);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = c0 + 8 * i, ch = 64 * nt + c;
    const float* src = (ch < Ch ? a.da + ch * plane : a.db + (ch - Ch) * plane) + at;
    dev::cp_async_16(dst + 4 * da_index(c, 4 * q), src, in);
  }
}

// [p | g] = x̂ Wcat_ntᵀ + bias for the consumer's 64 rows (fp16; both logits of a channel in one
// thread's pair: wcat interleaves them). The product starts from zero and the bias loads are
// issued while it runs, then added: accumulators written by plain moves before the fence make
// ptxas serialize every wgmma of the kernel (C7520), the d x̂ products' included.
__device__ __forceinline__ void recompute(float (&pg)[64], const TailSmem& s, int c, const float* bias) {
  const int t = threadIdx.x & 3;
  dev::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    dev::Wgmma<__half, 0, 0>::run(pg, k_desc(s.xhat(c), TailSmem::kWgTile / 2, kk),
                                  k_desc(s.base + TailSmem::kWcat, TailSmem::kWgTile, kk), kk > 0);
  dev::wgmma_commit();
  float2 b[16];  // [n8 tile] this thread's two channels' biases
#pragma unroll
  for (int i = 0; i < 16; ++i) b[i] = *reinterpret_cast<const float2*>(bias + 8 * i + 2 * t);
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(pg);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    pg[4 * i] += b[i].x, pg[4 * i + 2] += b[i].x;
    pg[4 * i + 1] += b[i].y, pg[4 * i + 3] += b[i].y;
  }
}

// d x̂ += A Wraw_tile over 128 dlin columns, A from `a_hi` (and `a_lo`: the same columns' low
// parts, against the same weight rows); `first` overwrites d x̂.
__device__ __forceinline__ void accumulate_dxhat(float (&dx)[64], const TailSmem& s, uint32_t a_hi, uint32_t a_lo,
                                                 bool with_lo, bool first) {
  dev::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t b = dev::wgmma_desc(s.base + TailSmem::kWraw + (kk / 4) * TailSmem::kWgTile + 2048 * (kk % 4),
                                       TailSmem::kWgTile / 2, 1024);
    dev::Wgmma<bf16, 0, 1>::run(dx, k_desc(a_hi, TailSmem::kWgTile / 2, kk), b, !first || kk > 0);
    if (with_lo) dev::Wgmma<bf16, 0, 1>::run(dx, k_desc(a_lo, TailSmem::kWgTile / 2, kk), b, 1);
  }
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  dev::wgmma_fence_operands(dx);
}

// A column tile's dlin from the recomputed logits (bias included): d p = da s mask, d g = da p s
// (1 - s) mask (s = sigmoid(g)), as bf16 high and low parts into the consumer's A tiles (which a TMA store
// then copies to dlin); sums: the tile's column totals over the warp's 16 rows, reduce-scattered
// (reduce_scatter_rows). Thread (g, t) holds channels 4i + t (i < 16) of rows g, g + 8 of its
// warp; i = 4k + n puts its 8 values of k at dlin columns 32k + 8t .. + 7 (dlin_order.h).
__device__ __forceinline__ void dlin_epilogue(const float (&pg)[64], const TailSmem& s, int c, uint32_t da_s,
                                              const float (&mk)[2], float (&sums)[32]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
  const float* da = reinterpret_cast<const float*>(s.ptr + (da_s - s.base));  // [64 ch][64 px]
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float v[2][8];  // [row half][2n + e]
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int i = 4 * k + n;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float up = da[da_index(4 * i + t, 16 * w + g + 8 * h)] * mk[h];
        const float p = pg[4 * i + 2 * h], sg = sigmoid(pg[4 * i + 2 * h + 1]);
        v[h][2 * n] = up * sg;
        v[h][2 * n + 1] = up * p * sg * (1.f - sg);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * w + g + 8 * h;
      float lo[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) sums[8 * k + e] += v[h][e], lo[e] = v[h][e] - dev::to_float(dev::from_float<bf16>(v[h][e]));
      const uint4 hi4 = dev::pack8<bf16>(v[h]), lo4 = dev::pack8<bf16>(lo);
      // plain stores (not asm volatile), which leave the compiler free to hoist the next da reads
      const uint32_t at = chunk_at(r, 4 * k + t);
      *reinterpret_cast<uint4*>(s.ptr + TailSmem::kHi + c * TailSmem::kWgTile + at) = hi4;
      *reinterpret_cast<uint4*>(s.ptr + TailSmem::kLo + c * TailSmem::kWgTile + at) = lo4;
    }
  }
  reduce_scatter_rows(sums);
}

// Two consecutive channels of a row (one 4- or 8-byte access where aligned).
template <class T>
__device__ __forceinline__ float2 load2(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0) {
    if constexpr (sizeof(T) == 4) return *reinterpret_cast<const float2*>(p);
    else return dev::pair_to_float2<T>(*reinterpret_cast<const uint32_t*>(p));
  }
  return make_float2(dev::to_float(p[0]), dev::to_float(p[1]));
}
template <class T>
__device__ __forceinline__ void store2(T* p, float x, float y) {
  if (reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0) {
    if constexpr (sizeof(T) == 4) *reinterpret_cast<float2*>(p) = make_float2(x, y);
    else *reinterpret_cast<uint32_t*>(p) = dev::MmaOp<T>::pack(x, y);
  } else {
    p[0] = dev::from_float<T>(x), p[1] = dev::from_float<T>(y);
  }
}

// What LayerNorm_in's backward reads of the thread's rows (g, g + 8 of its warp), loaded before
// the gate columns' MMA so that its latency hides under it; dz_in's lines are sent toward L2.
struct NormRows {
  uint32_t z[2][16];  // [row half][i] z at channels 8i + 2t, + 1 (bf16 pair)
  float mu[2], rs[2];
};
__device__ __forceinline__ uint32_t load2_raw(const bf16* p) {
  if (reinterpret_cast<uintptr_t>(p) % 4 == 0) return *reinterpret_cast<const uint32_t*>(p);
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return h[0] | (uint32_t(h[1]) << 16);
}
template <class Tdz>
__device__ __forceinline__ void load_norm_rows(const TailArgs& a, int64_t mw, NormRows& nr) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = mw + 16 * w + g + 8 * h;
    const bool in = m < a.r1;
    nr.mu[h] = in ? a.mean[m] : 0.f, nr.rs[h] = in ? a.rstd[m] : 0.f;
    const bf16* zr = static_cast<const bf16*>(a.z.ptr) + (in ? pair_offset(a.z, m, a.d.N) : 0);
#pragma unroll
    for (int i = 0; i < 16; ++i) nr.z[h][i] = in ? load2_raw(zr + 8 * i + 2 * t) : 0u;
    constexpr int kLines = 128 * sizeof(Tdz) / 128;  // a dz_in row's 128-byte lines
    if (a.dz_in.ptr && in && t < kLines)
      dev::prefetch_l2(static_cast<const Tdz*>(a.dz_in.ptr) + pair_offset(a.dz_in, m, a.d.N) + t * (128 / sizeof(Tdz)));
  }
}

// LayerNorm_in's backward on the d x̂ accumulator (rows g, g + 8 of the warp, channels 8i + 2t
// + e; the quad's four lanes hold a row): dz = rstd (d x̂ gamma - mean - x̂ mean(d x̂ gamma x̂))
// + dz_in; pgb: d gamma (d x̂ x̂) and d beta (d x̂) over the warp's rows, reduce-scattered.
template <class Tdz>
__device__ __forceinline__ void norm_backward(const TailArgs& a, const float (&dx)[64], const float* gamma,
                                              int64_t mw, const NormRows& nr, float (&pgb)[64]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 64; ++j) pgb[j] = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = mw + 16 * w + g + 8 * h;
    const bool in = m < a.r1;
    const float mu = nr.mu[h], rs = nr.rs[h];
    // dz_in at the row's channels 8i + 2t, + 1, read in batches ahead of their dz stores: dz may
    // be dz_in itself, so a load after a store cannot be hoisted above it (one L2 round trip
    // each, in series). The first batch is read here, under the row statistics' work. Four a
    // batch: eight left the consumer's 232 registers short (4 bytes of spills).
    constexpr int kBatch = 4;
    static_assert(16 % kBatch == 0, "whole batches of the row's 16 pairs");
    const Tdz* add = a.dz_in.ptr && in ? static_cast<const Tdz*>(a.dz_in.ptr) + pair_offset(a.dz_in, m, a.d.N) : nullptr;
    float2 r[kBatch];
    auto read_batch = [&](int i0) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) r[i] = add ? load2(add + 8 * (i0 + i) + 2 * t) : make_float2(0.f, 0.f);
    };
    read_batch(0);
    auto xhat = [&](int i, int e) {
      const float2 zf = dev::pair_to_float2<bf16>(nr.z[h][i]);
      return ((e ? zf.y : zf.x) - mu) * rs;
    };
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = in ? dx[4 * i + 2 * h + e] : 0.f, xh = in ? xhat(i, e) : 0.f;
        const float gg = v * gamma[8 * i + 2 * t + e];
        pgb[2 * i + e] += v * xh, pgb[32 + 2 * i + e] += v;
        s1 += gg, s2 += gg * xh;
      }
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1), s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    s2 += __shfl_xor_sync(0xffffffffu, s2, 1), s2 += __shfl_xor_sync(0xffffffffu, s2, 2);
    const float mg = s1 / 128.f, mgx = s2 / 128.f;
    if (!in) continue;
    Tdz* dst = static_cast<Tdz*>(a.dz.ptr) + pair_offset(a.dz, m, a.d.N);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (i > 0 && i % kBatch == 0) read_batch(i);
      const int col = 8 * i + 2 * t;
      float o[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) o[e] = rs * (dx[4 * i + 2 * h + e] * gamma[col + e] - mg - xhat(i, e) * mgx);
      if (add) o[0] += r[i % kBatch].x, o[1] += r[i % kBatch].y;
      store2(dst + col, o[0], o[1]);
    }
  }
  reduce_scatter_rows(pgb);
}

}  // namespace tpf::trimul::tail
