// The attention forward's load parts (forward.cu): the Q, K, V and bias tiles of a
// (b, s, h) slice and query tile, by TMA or cp.async, double-buffered along the keys; and the
// key mask, streamed into shared memory as each stage's 0 / -inf score offsets.
#pragma once
#include "attention/forward_tiles.cuh"

namespace tpf::attn {
namespace {

// One cp.async group per key tile, or (TMA) one mbarrier phase. wgmma reads V a tile late (see
// FwdMma), so with wgmma the loads of V run a tile behind those of K and the bias.
template <class T, class BiasT, int D, bool kTma>
struct FwdLoads {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  using Smem = FwdSmem<T, BiasT, D, kTma>;
  using Bias = BiasTile<BiasT, Cfg::kBlockQ, Cfg::kBlockK>;  // cp.async's padded tile
  using BiasTma = BiasSwz128<Cfg::kBlockQ, Cfg::kBlockK, sizeof(BiasT)>;
  static constexpr int BQ = Cfg::kBlockQ, BK = Cfg::kBlockK;
  static constexpr bool kWgmma = fwd_wgmma<BiasT, D>();
  const FwdArgs& a;
  const FwdMaps& maps;
  const Smem& sm;
  const int q0, b, s, h, tid, n_tiles;
  const T *gQ, *gK, *gV;
  const BiasT* gBias;
  const TileCopier<D, BK, Cfg::kThreads> kv_copier;
  const BiasCopier<BiasT, BQ, BK, Cfg::kThreads> bias_copier;

  __device__ __forceinline__ FwdLoads(const FwdArgs& a_, const FwdMaps& maps_, const Smem& sm_, int q0_, int b_,
                                      int s_, int h_, int tid_)
      : a(a_), maps(maps_), sm(sm_), q0(q0_), b(b_), s(s_), h(h_), tid(tid_),
        n_tiles((a_.dims.N + BK - 1) / BK), gQ(slice_ptr<T>(a_.q, b_, s_, h_)), gK(slice_ptr<T>(a_.k, b_, s_, h_)),
        gV(slice_ptr<T>(a_.v, b_, s_, h_)),
        gBias(static_cast<const BiasT*>(a_.bias.ptr) + b_ * a_.bias.sb + h_ * a_.bias.sh), kv_copier(tid_),
        bias_copier(tid_) {}

  __device__ __forceinline__ void load_k(int tile, int stage) const {
    kv_copier.copy<true>(sm.k + stage * BK * D, gK, a.k.sn, tile * BK, a.dims.N);
  }
  __device__ __forceinline__ void load_v(int tile, int stage) const {
    kv_copier.copy<true>(sm.v + stage * BK * D, gV, a.v.sn, tile * BK, a.dims.N);
  }
  __device__ __forceinline__ void load_bias(int tile, int stage) const {
    bias_copier.copy<true>(sm.bias + stage * Bias::kBytes, a.bias, gBias, q0, tile * BK, a.dims.N, tid);
  }

  // TMA, thread 0: the copies tile `batch` waits for (see FwdSmem::bar); the coordinates are
  // innermost first: (d, row, h, s, b) and (key, query, h, b). With wgmma the batch carries the
  // previous tile's V; with mma.sync V of the tile itself.
  __device__ __forceinline__ void issue_batch(int batch) const {
    constexpr uint32_t kKV = BK * D * 2, kBias = BiasTma::kBytes, kQ = BQ * D * 2;
    if constexpr (!kWgmma) {
      if (batch >= n_tiles) return;  // nothing left (the loop's last call)
    }
    const bool with_v = !kWgmma || batch > 0;
    const uint32_t bytes = (batch < n_tiles ? kKV + kBias : 0) + (with_v ? kKV : 0) + (batch == 0 ? kQ : 0);
    dev::mbar_arrive_expect_tx(sm.bar(batch), bytes);
    if (batch == 0) dev::tma_load_5d(dev::smem_addr(sm.q), &maps.q, sm.bar(0), 0, q0, h, s, b);
    if (batch < n_tiles) {
      const int st = batch % Cfg::kStages;
      dev::tma_load_5d(dev::smem_addr(sm.k + st * BK * D), &maps.k, sm.bar(batch), 0, batch * BK, h, s, b);
#pragma unroll
      for (int part = 0; part < BK / BiasTma::kPartKeys; ++part)
        dev::tma_load_4d(dev::smem_addr(sm.bias + st * Smem::kBiasBytes + part * BiasTma::kPartBytes), &maps.bias,
                         sm.bar(batch), batch * BK + part * BiasTma::kPartKeys, q0, h, b);
    }
    if (with_v) {
      const int v_tile = kWgmma ? batch - 1 : batch;
      dev::tma_load_5d(dev::smem_addr(sm.v + (v_tile % Cfg::kStages) * BK * D), &maps.v, sm.bar(batch), 0,
                       v_tile * BK, h, s, b);
    }
  }

  // Q and the first key tile.
  __device__ __forceinline__ void prologue() const {
    if constexpr (kTma) {
      if (tid == 0) {
        dev::mbar_init(sm.bar(0), 1);
        dev::mbar_init(sm.bar(1), 1);
        dev::mbar_init_fence();
      }
      __syncthreads();
      if (tid == 0) issue_batch(0);
    } else {
      TileCopier<D, BQ, Cfg::kThreads>(tid).copy(sm.q, gQ, a.q.sn, q0, a.dims.N);
      load_k(0, 0);
      if constexpr (!kWgmma) load_v(0, 0);
      load_bias(0, 0);
      dev::cp_async_commit();
    }
  }

  // This thread's share of tile j has landed (the caller's barrier makes it everyone's).
  __device__ __forceinline__ void wait(int j) const {
    if constexpr (kTma) {
      dev::mbar_wait(sm.bar(j), Smem::bar_parity(j));
    } else {
      dev::cp_async_wait<0>();
      if constexpr (kWgmma) dev::fence_proxy_async();  // this thread's copies, visible to wgmma
    }
  }

  // After tile j's barrier every warp has finished tile j - 1, so its stage can take tile j + 1,
  // which then has all of tile j's math to land. wgmma: tile j reads V of tile j - 1 (PV a tile
  // late), so V of tile j goes into stage j, whose previous tile's PV every warp waited for in
  // tile j - 1. (Loading it as soon as this warp had waited for that PV raced with the other
  // warps' parts of it: O off by 2x the bf16 floor, docs/perf-history.md.)
  __device__ __forceinline__ void next(int j, int stage) const {
    if constexpr (kTma) {
      if (tid == 0) issue_batch(j + 1);
    } else {
      if (j + 1 < n_tiles) {
        load_k(j + 1, (j + 1) % Cfg::kStages);
        if constexpr (!kWgmma) load_v(j + 1, (j + 1) % Cfg::kStages);
        load_bias(j + 1, (j + 1) % Cfg::kStages);
      }
      if constexpr (kWgmma) load_v(j, stage);
      dev::cp_async_commit();
    }
  }

  // wgmma: V of the last tile, for the PV after the loop.
  __device__ __forceinline__ void wait_last_v() const {
    if constexpr (kTma) {
      dev::mbar_wait(sm.bar(n_tiles), Smem::bar_parity(n_tiles));
    } else {
      dev::cp_async_wait<0>();
      dev::fence_proxy_async();
      __syncthreads();
    }
  }
};

// Key mask of the tiles in order for thread tid < BK: the raw byte (0 = masked; keys past N read
// as 0), loaded two tiles ahead into a register and turned into 0 / -inf only when stored a tile
// later, so that nothing waits for the load (converting at the load stalled every tile). The
// thread's key and pointer step a tile per call.
template <int BK, int kThreads>
struct KeyMaskStream {
  using Mask = FwdMask<BK>;
  const bool active;
  const int N;
  int key;
  const uint8_t* ptr;
  const int64_t step;
  float* const base;  // [stages][Mask::kFloats]
  float* const dst;   // this thread's key in stage 0
  int ahead = 0;

  __device__ __forceinline__ KeyMaskStream(const FwdArgs& a, int b, int s, int tid, float* smask)
      : active(BK >= kThreads || tid < BK), N(a.dims.N), key(tid),
        ptr(a.mask.ptr ? a.mask.ptr + b * a.mask.sb + s * a.mask.ss + tid * a.mask.sk : nullptr),
        step(a.mask.ptr ? BK * a.mask.sk : 0), base(smask), dst(smask + Mask::slot(tid)) {}

  __device__ __forceinline__ int byte() {
    int v = 0;
    if (key < N) v = ptr ? *ptr : 1;
    key += BK;
    ptr += step;
    return v;
  }
  __device__ __forceinline__ static float value(int byte) { return byte ? 0.f : -INFINITY; }

  // Stage 0 gets tile 0; tile 1's byte is loaded.
  __device__ __forceinline__ void start() {
    if (active) {
      *dst = value(byte());
      ahead = byte();
    }
  }
  // The scores' initial value: the mask of the tile in `stage` (keys 8 nt + 2 t, + 1).
  template <int NT>
  __device__ __forceinline__ void scores_from_mask(float (&sc)[NT][4], int stage, int t) const {
    const float2* pairs = reinterpret_cast<const float2*>(base + stage * Mask::kFloats + t * Mask::kRow);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float2 mk = pairs[nt];
      sc[nt][0] = sc[nt][2] = mk.x;
      sc[nt][1] = sc[nt][3] = mk.y;
    }
  }
  // During tile j: tile j + 1 into its stage, tile j + 2's byte loaded.
  __device__ __forceinline__ void advance(int j, int stages) {
    if (active) {
      dst[((j + 1) % stages) * Mask::kFloats] = value(ahead);
      ahead = byte();
    }
  }
};

}  // namespace
}  // namespace tpf::attn
