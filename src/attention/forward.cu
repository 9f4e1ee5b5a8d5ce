// Triangle attention forward: FlashAttention-2 style online softmax in the log2 domain, pair
// bias added to the scores, key mask, outputs O (activation dtype), its rounding residual R and
// the natural-log LSE. One block = one (b, s, h) slice x FwdConfig::kBlockQ query rows.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/kernel_attrs.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "attention/dispatch.cuh"
#include "attention/kernels.h"
#include "attention/tma_maps.h"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"

namespace tpf::attn {
namespace {

template <class BiasT, int D, bool kTma = false>
using FwdCfg = FwdConfig<D, sizeof(BiasT), kTma>;
// A stage's bias tile: cp.async's padded rows, or TMA's 128-byte swizzle.
template <class BiasT, int D, bool kTma>
using FwdBiasTile = std::conditional_t<kTma, BiasSwz128<FwdCfg<BiasT, D, kTma>::kBlockQ, FwdCfg<BiasT, D, kTma>::kBlockK, sizeof(BiasT)>,
                                       BiasTile<BiasT, FwdCfg<BiasT, D, kTma>::kBlockQ, FwdCfg<BiasT, D, kTma>::kBlockK>>;

// The key mask of a tile, 0 or -inf per key as fp32: the initial value of the score
// accumulators, to which QK^T is added (exact, and no instruction per score: an m16n8k8 MMA per
// n-tile added it before). Stored in the order a lane reads it: the lanes with t = lane % 4 hold
// keys 8 nt + 2 t, +1 of every n-tile nt, which are the float pairs [kRow t + 2 nt]; rows are
// padded by a pair so that the four t fall in different banks.
template <int BK>
struct FwdMask {
  static constexpr int kTiles = BK / 8;
  static constexpr int kRow = 2 * kTiles + 2;
  static constexpr int kFloats = 4 * kRow;
  __device__ __forceinline__ static int slot(int key) { return (key % 8 / 2) * kRow + key / 8 * 2 + key % 2; }
};

// QK^T and PV by wgmma (m64n128k16 from shared memory, m64n32k16 with P from registers):
// K and V are read once per warpgroup instead of once per warp by ldmatrix (a third of the
// tile's shared-memory traffic each), and 128 ldmatrix + HMMA issue slots per warp and tile
// go. The shapes the wrappers in common/wgmma.cuh cover: D = 32 with 128- or 64-key tiles.
template <class BiasT, int D>
constexpr bool fwd_wgmma() {
  return D == 32 && (FwdCfg<BiasT, D>::kBlockK == 128 || FwdCfg<BiasT, D>::kBlockK == 64);
}

// TMA tile loads (D = 16, 32 and 64, where the strides are ones the hardware accepts: the launch
// checks): one thread issues the tile copies of a key tile, which complete on an mbarrier,
// instead of every thread issuing cp.async chunks with their address arithmetic (~150 of ~730
// instructions per warp and tile, perf-notes v14; an fp32 bias, D = 16 and 64 since v19). Q, K,
// V: rows of D elements in the 32-, 64- or 128-byte swizzle, which is common/swizzle.cuh's
// layout (the ldmatrix reads) and at D = 32 the one the wgmma descriptors read; bias: 128-byte
// swizzle in parts of 128 bytes of keys (BiasSwz128). D = 128's 256-byte rows would need two
// boxes a row and another layout.
struct FwdMaps {  // CUtensorMap is 64-byte aligned itself
  CUtensorMap q, k, v, bias;
};
template <class BiasT, int D>
constexpr bool fwd_tma_able() {
  return fwd_wgmma<BiasT, D>() || D == 16 || D == 64;
}

template <class BiasT, int D, bool kTma>
constexpr size_t fwd_smem_bytes() {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  // sQ [BQ][D] + sK, sV [stages][BK][D] + bias tiles [stages][BQ][BK] (bias dtype: padded rows,
  // or BiasSwz128 with TMA) + key mask [stages][FwdMask] (fp32) + TMA: 2 mbarriers; with wgmma,
  // room to start the tiles on the 64-byte swizzle's 512-byte period (TMA: the 128-byte
  // swizzle's 1024).
  constexpr size_t bias = FwdBiasTile<BiasT, D, kTma>::kBytes;
  return (Cfg::kBlockQ * D + 2 * Cfg::kStages * Cfg::kBlockK * D) * 2 + Cfg::kStages * bias +
         Cfg::kStages * FwdMask<Cfg::kBlockK>::kFloats * 4 + (kTma ? 16 + 1024 : fwd_wgmma<BiasT, D>() ? 512 : 0);
}

// Launch-bounds hint: the configured one (tile_config.h), else 0 (the compiler's choice, which
// stays within the 168 registers of 3 blocks/SM at D = 32 and 64) where shared memory allows 3
// blocks, else the blocks it allows (fp32 bias tiles: 2, so up to 255 registers instead of spills
// at 168).
template <class BiasT, int D, bool kTma>
constexpr int fwd_min_blocks() {
  constexpr int by_smem = static_cast<int>(227 * 1024 / fwd_smem_bytes<BiasT, D, kTma>());
  using Cfg = FwdCfg<BiasT, D, kTma>;
  return Cfg::kMinBlocks != 0 ? Cfg::kMinBlocks : (by_smem >= 3 ? 0 : by_smem);
}

template <class T, class BiasT, int D, bool kTma>
__global__ void __launch_bounds__(FwdCfg<BiasT, D, kTma>::kThreads, (fwd_min_blocks<BiasT, D, kTma>()))
    forward_kernel(const FwdArgs a, const __grid_constant__ FwdMaps maps) {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  constexpr int BQ = Cfg::kBlockQ, BK = Cfg::kBlockK, NT = BK / 8, DT = D / 8, KS = D / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  using Mma = dev::MmaOp<T>;
  using Bias = BiasTile<BiasT, BQ, BK>;  // cp.async's padded tile
  using BiasTma = BiasSwz128<BQ, BK, sizeof(BiasT)>;
  // 16-bit bias: added by one MMA per n-tile as bias / scale, so that scores stay in units of
  // scale (QK^T + bias / scale) and need no instruction of their own before the max (two FFMAs
  // and a 16-bit unpack per score before). fp32 bias: s = scale QK^T + bias per score.
  constexpr bool kBiasMma = sizeof(BiasT) == 2;
  constexpr bool kWgmma = fwd_wgmma<BiasT, D>();
  extern __shared__ __align__(128) uint8_t smem_raw[];
  constexpr uint32_t kAlign = kTma ? 1024 : kWgmma ? 512 : 1;
  uint8_t* smem = smem_raw + ((kAlign - (dev::smem_addr(smem_raw) & (kAlign - 1))) & (kAlign - 1));
  T* sQ = reinterpret_cast<T*>(smem);               // [BQ][D]
  T* sK = sQ + BQ * D;                              // [stages][BK][D]
  T* sV = sK + Cfg::kStages * BK * D;               // [stages][BK][D]
  using Mask = FwdMask<BK>;
  constexpr int kBiasBytes = FwdBiasTile<BiasT, D, kTma>::kBytes;                 // a stage
  uint8_t* sBias = reinterpret_cast<uint8_t*>(sV + Cfg::kStages * BK * D);         // [stages] bias tiles
  float* sMask = reinterpret_cast<float*>(sBias + Cfg::kStages * kBiasBytes);      // [stages][Mask]
  // TMA: the copies issued at the top of tile j - 1 (K, bias of tile j, V of tile j - 1; the
  // prologue: Q, K and bias of tile 0) complete on bar[j % 2], phase parity (j / 2) % 2.
  const uint32_t bar0 = dev::smem_addr(sMask + Cfg::kStages * Mask::kFloats);     // 2 x 8 bytes
  auto bar = [&](int batch) { return bar0 + 8 * (batch & 1); };
  auto bar_parity = [](int batch) { return static_cast<uint32_t>(batch >> 1) & 1u; };

  const int N = a.dims.N;
  // Query tiles vary fastest: the blocks in flight share few slices, whose K/V stay in L2.
  const int q0 = blockIdx.x * BQ, s = blockIdx.y;
  const int b = blockIdx.z / a.dims.H, h = blockIdx.z % a.dims.H;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  const T* gQ = slice_ptr<T>(a.q, b, s, h);
  const T* gK = slice_ptr<T>(a.k, b, s, h);
  const T* gV = slice_ptr<T>(a.v, b, s, h);
  const BiasT* gBias = static_cast<const BiasT*>(a.bias.ptr) + b * a.bias.sb + h * a.bias.sh;
  const uint8_t* gMask = a.mask.ptr ? a.mask.ptr + b * a.mask.sb + s * a.mask.ss : nullptr;
  const TileCopier<D, BK, Cfg::kThreads> kv_copier(tid);
  const BiasCopier<BiasT, BQ, BK, Cfg::kThreads> bias_copier(tid);

  auto load_k = [&](int tile, int stage) { kv_copier.copy<true>(sK + stage * BK * D, gK, a.k.sn, tile * BK, N); };
  auto load_v = [&](int tile, int stage) { kv_copier.copy<true>(sV + stage * BK * D, gV, a.v.sn, tile * BK, N); };
  auto load_bias = [&](int tile, int stage) {
    bias_copier.copy<true>(sBias + stage * Bias::kBytes, a.bias, gBias, q0, tile * BK, N, tid);
  };
  const int n_tiles = (N + BK - 1) / BK;
  // TMA, thread 0: the copies tile `batch` waits for (see bar); the coordinates are innermost
  // first: (d, row, h, s, b) and (key, query, h, b). wgmma reads V a tile late (see the loop), so
  // its batch carries the previous tile's V; mma.sync reads V of the tile itself.
  auto issue_batch = [&](int batch) {
    constexpr uint32_t kKV = BK * D * 2, kBias = BiasTma::kBytes, kQ = BQ * D * 2;
    if constexpr (!kWgmma) {
      if (batch >= n_tiles) return;  // nothing left (the loop's last call)
    }
    const bool with_v = !kWgmma || batch > 0;
    const uint32_t bytes = (batch < n_tiles ? kKV + kBias : 0) + (with_v ? kKV : 0) + (batch == 0 ? kQ : 0);
    dev::mbar_arrive_expect_tx(bar(batch), bytes);
    if (batch == 0) dev::tma_load_5d(dev::smem_addr(sQ), &maps.q, bar(0), 0, q0, h, s, b);
    if (batch < n_tiles) {
      const int st = batch % Cfg::kStages;
      dev::tma_load_5d(dev::smem_addr(sK + st * BK * D), &maps.k, bar(batch), 0, batch * BK, h, s, b);
#pragma unroll
      for (int part = 0; part < BK / BiasTma::kPartKeys; ++part)
        dev::tma_load_4d(dev::smem_addr(sBias + st * kBiasBytes + part * BiasTma::kPartBytes), &maps.bias,
                         bar(batch), batch * BK + part * BiasTma::kPartKeys, q0, h, b);
    }
    if (with_v) {
      const int v_tile = kWgmma ? batch - 1 : batch;
      dev::tma_load_5d(dev::smem_addr(sV + (v_tile % Cfg::kStages) * BK * D), &maps.v, bar(batch), 0,
                       v_tile * BK, h, s, b);
    }
  };
  // Key mask of the tiles in order for thread tid < BK: the raw byte (0 = masked; keys past N
  // read as 0), loaded two tiles ahead into a register and turned into 0 / -inf only when stored
  // a tile later, so that nothing waits for the load (converting at the load stalled every
  // tile). The thread's key and pointer step a tile per call.
  const bool mask_thread = BK >= Cfg::kThreads || tid < BK;
  int mask_key = tid;
  const uint8_t* mask_ptr = gMask ? gMask + tid * a.mask.sk : nullptr;
  const int64_t mask_step = gMask ? BK * a.mask.sk : 0;
  auto mask_byte = [&]() {
    int v = 0;
    if (mask_key < N) v = mask_ptr ? *mask_ptr : 1;
    mask_key += BK;
    mask_ptr += mask_step;
    return v;
  };
  float* const mask_dst = sMask + Mask::slot(tid);  // this thread's key in stage 0
  auto mask_value = [](int byte) { return byte ? 0.f : -INFINITY; };
  int mask_ahead = 0;
  if (mask_thread) {
    *mask_dst = mask_value(mask_byte());
    mask_ahead = mask_byte();
  }

  // One cp.async group per tile (TMA: one mbarrier phase). wgmma reads V a tile later (see the
  // loop), so its V tiles are loaded a tile later too.
  if constexpr (kTma) {
    if (tid == 0) {
      dev::mbar_init(bar(0), 1);
      dev::mbar_init(bar(1), 1);
      dev::mbar_init_fence();
    }
    __syncthreads();
    if (tid == 0) issue_batch(0);
  } else {
    TileCopier<D, BQ, Cfg::kThreads>(tid).copy(sQ, gQ, a.q.sn, q0, N);
    load_k(0, 0);
    if constexpr (!kWgmma) load_v(0, 0);
    load_bias(0, 0);
    dev::cp_async_commit();
  }

  // Rows this thread holds in every accumulator: r = 0 -> warp row g, r = 1 -> g + 8.
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float o[DT][4] = {};                              // O accumulator, 16 rows x D per warp
  // Row sums of P come out of the tensor cores: P times a column of ones (B fragment: column 0
  // of the n-tile is 1, the rest 0), so lsum[0] / lsum[2] of lane t = 0 hold rows g / g + 8.
  float lsum[4] = {};
  const uint32_t ones = g == 0 ? dev::MmaOp<T>::pack(1.f, 1.f) : 0u;
  float m[2] = {-INFINITY, -INFINITY};              // running row max, in score units
  uint32_t unscale[2] = {};                         // B: 1/scale times a doubled identity
  if constexpr (kBiasMma) dev::scaled_identity_b<T>(unscale, 1.f / a.scale, lane);
  const float unit = kBiasMma ? a.scale : 1.f;      // a score unit in natural-log units
  const float to_log2 = unit * kLog2e;
  uint32_t qa[kWgmma ? 1 : KS][4];                  // Q rows of this warp as A fragments (mma.sync)

  // This lane's byte offset in a K tile for each k16 step's ldmatrix (rows np * 16 + its row
  // share its swizzle): computed once, so the loop adds only the stage and immediates.
  uint32_t k_off[KS];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    k_off[ks] = 2 * dev::tile_offset<D>((lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1));
  // wgmma operands: Q and K K-major, V MN-major, in 64-byte-swizzled tiles (rows of D = 32
  // elements: common/swizzle.cuh's pattern is the hardware's); a k16 step is 32 bytes along a
  // row (Q, K) or 16 rows (V).
  const uint64_t q_desc0 = dev::wgmma_desc_rows32(dev::smem_addr(sQ));
  const uint64_t k_desc0 = dev::wgmma_desc_rows32(dev::smem_addr(sK));
  const uint64_t v_desc0 = dev::wgmma_desc_rows32(dev::smem_addr(sV));
  auto q_desc = [&](int ks) { return dev::wgmma_desc_advance(q_desc0, 32 * ks); };
  auto k_desc = [&](int st, int ks) { return dev::wgmma_desc_advance(k_desc0, st * BK * D * 2 + 32 * ks); };
  auto v_desc = [&](int st, int kk) { return dev::wgmma_desc_advance(v_desc0, (st * BK + kk * 16) * D * 2); };

  // wgmma: P of the previous tile, packed; its PV runs on the tensor cores during this tile's
  // bias, mask and softmax work (issued with this tile's QK^T, waited for before the rescale).
  uint32_t pa_prev[kWgmma ? BK / 16 : 1][4];
  [[maybe_unused]] float(&o_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(o);  // wgmma's view
  static_assert(!kWgmma || Cfg::kStages == 2, "the previous tile's stage is stage ^ 1");
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % Cfg::kStages;
    // One barrier per tile: after it every warp has finished tile j - 1 (see the loads below).
    if constexpr (kTma) {
      dev::mbar_wait(bar(j), bar_parity(j));
    } else {
      dev::cp_async_wait<0>();
      if constexpr (kWgmma) dev::fence_proxy_async();  // this thread's copies, visible to wgmma
    }
    __syncthreads();
    if (!kWgmma && j == 0) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
        dev::ldmatrix_x4(qa[ks], tile_at<D>(sQ, warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                            ks * 2 + (lane >> 4)));
    }
    const uint32_t tK = dev::smem_addr(sK + stage * BK * D);
    const T* tV = sV + stage * BK * D;
    const uint8_t* tBias = sBias + stage * kBiasBytes;

    // S tile, 16 rows x BK keys per warp (wgmma: the warpgroup's 64 rows), starting from the
    // key mask: s = QK^T + mask.
    float sc[NT][4];
    {
      const float2* mask_pairs = reinterpret_cast<const float2*>(sMask + stage * Mask::kFloats + t * Mask::kRow);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 mk = mask_pairs[nt];
        sc[nt][0] = sc[nt][2] = mk.x;
        sc[nt][1] = sc[nt][3] = mk.y;
      }
    }
    // The tensor cores start on QK^T (wgmma: and the previous tile's PV) before this tile's
    // loads are issued, so that the loads' issue slots cover the product's latency.
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
        for (int kk = 0; kk < BK / 16; ++kk)
          dev::WgmmaN32RS<T, 1>::run(o_flat, pa_prev[kk], v_desc(stage ^ 1, kk), 1);
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
    // After the barrier every warp has finished tile j - 1, so its stage can take tile j + 1
    // (loads and mask), which then has all of tile j's math to land. wgmma: this
    // tile reads V of tile j - 1 (PV a tile late), so V of tile j goes into stage j, whose
    // previous tile's PV every warp waited for in tile j - 1. (Loading it as soon as this warp
    // had waited for that PV raced with the other warps' parts of it: O off by 2x the bf16
    // floor in a1d0f33:bench/results/h200/v11_iter/attention_accuracy_race.md.)
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
    if (mask_thread) {
      mask_dst[((j + 1) % Cfg::kStages) * Mask::kFloats] = mask_value(mask_ahead);
      mask_ahead = mask_byte();
    }
    if constexpr (kWgmma) {
      dev::wgmma_wait<1>();  // QK^T done; the previous tile's PV may still run
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[NT * 4]>(sc));
    }

    // + bias: 16-bit, s = QK^T + mask + bias / scale (A: the warp's 16 rows x 8 keys of the
    // bias tile, twice along k); fp32, s = scale (QK^T + mask) + bias.
    if constexpr (kBiasMma && kTma) {
      const uint32_t bias_addr = dev::smem_addr(tBias) + BiasTma::row_offset(warp * 16, lane);
      const uint32_t xor_bytes = (lane & 7) * 16;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t ba[4];
        dev::ldmatrix_x4(ba, bias_addr + BiasTma::chunk_offset(nt, xor_bytes));
        Mma::run(sc[nt], ba, unscale[0], unscale[1]);
      }
    } else if constexpr (kBiasMma) {
      using BiasA = BiasDupA<BiasT, BQ, BK>;
      const uint32_t bias_addr = dev::smem_addr(tBias) + BiasA::offset(warp * 16, lane);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t ba[4];
        BiasA::load(ba, bias_addr + nt * 16);
        Mma::run(sc[nt], ba, unscale[0], unscale[1]);
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
          sc[nt][2 * r] = fmaf(sc[nt][2 * r], a.scale, bias.x);
          sc[nt][2 * r + 1] = fmaf(sc[nt][2 * r + 1], a.scale, bias.y);
        }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(tile_max[r], fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
    // Online softmax, two rows per thread, reduced across the quad of lanes sharing a row.
    float alpha[2], neg_base[2];
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
    if constexpr (kWgmma) {
      // The exponentials first (pinned by the register fence: the compiler may otherwise move
      // them past the wait), then the previous tile's PV, before O is rescaled.
      dev::wgmma_fence_operands(reinterpret_cast<float(&)[NT * 4]>(sc));
      dev::wgmma_wait<0>();
      dev::wgmma_fence_operands(o_flat);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lsum[e] *= alpha[e / 2];
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) o[dt][e] *= alpha[e / 2];
    }

    // O += P V, P straight from registers as the A operand.
    if constexpr (kWgmma) {  // issued with the next tile's QK^T, or after the loop
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        dev::acc_to_a<T>(pa_prev[kk], sc[2 * kk], sc[2 * kk + 1]);
        Mma::run(lsum, pa_prev[kk], ones, ones);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t pa[4];
        dev::acc_to_a<T>(pa, sc[2 * kk], sc[2 * kk + 1]);
        Mma::run(lsum, pa, ones, ones);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          dev::ldmatrix_x4_trans(vb, tile_at<D>(tV, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                dp * 2 + (lane >> 4)));
          dev::mma_n16<T>(o[2 * dp], o[2 * dp + 1], pa, vb);
        }
      }
    }
  }
  if constexpr (kWgmma) {  // the last tile's PV
    if constexpr (kTma) {
      dev::mbar_wait(bar(n_tiles), bar_parity(n_tiles));
    } else {
      dev::cp_async_wait<0>();
      dev::fence_proxy_async();
      __syncthreads();
    }
    dev::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      dev::WgmmaN32RS<T, 1>::run(o_flat, pa_prev[kk], v_desc((n_tiles - 1) % Cfg::kStages, kk), 1);
    dev::wgmma_commit();
    dev::wgmma_wait<0>();
    dev::wgmma_fence_operands(o_flat);
  }

  // Normalise, write O, its residual and the LSE. A row with every key masked has l = 0:
  // its output is 0 and its LSE +inf, so the backward's P is 0 too. A NaN l leaves O NaN.
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
      if (gR) {
        const T* rounded = reinterpret_cast<const T*>(&packed);
        const uint32_t res = dev::MmaOp<T>::pack(o0 - dev::to_float(rounded[0]),
                                                 o1 - dev::to_float(rounded[1]));
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

// The TMA maps of a call (attention/tma_maps.h), or false where the kernel loads with cp.async.
template <class T, class BiasT, int D>
bool encode_fwd_maps(const FwdArgs& a, FwdMaps* maps) {
  using Cfg = FwdCfg<BiasT, D, true>;
  constexpr bool kFp16 = std::is_same_v<T, __half>;
  return tma_slice_rows(&maps->q, a.q, a.dims, D, kFp16, Cfg::kBlockQ) &&
         tma_slice_rows(&maps->k, a.k, a.dims, D, kFp16, Cfg::kBlockK) &&
         tma_slice_rows(&maps->v, a.v, a.dims, D, kFp16, Cfg::kBlockK) &&
         tma_bias_tiles(&maps->bias, a.bias, a.dims, kFp16, Cfg::kBlockQ);
}

template <class T, class BiasT, int D>
struct LaunchForward {
  template <bool kTma>
  static cudaError_t launch(const FwdArgs& a, const FwdMaps& maps, cudaStream_t stream) {
    using Cfg = FwdCfg<BiasT, D, kTma>;
    constexpr size_t smem = fwd_smem_bytes<BiasT, D, kTma>();
    auto kernel = forward_kernel<T, BiasT, D, kTma>;
    if (const cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, static_cast<int>(smem)); e != cudaSuccess) return e;
    const dim3 grid((a.dims.N + Cfg::kBlockQ - 1) / Cfg::kBlockQ, a.dims.S, a.dims.B * a.dims.H);
    kernel<<<grid, Cfg::kThreads, smem, stream>>>(a, maps);
    return cudaGetLastError();
  }
  static cudaError_t run(const FwdArgs& a, cudaStream_t stream) {
    FwdMaps maps{};  // unused by the cp.async kernels
    if constexpr (fwd_tma_able<BiasT, D>()) {
      if (encode_fwd_maps<T, BiasT, D>(a, &maps)) return launch<true>(a, maps, stream);
    }
    return launch<false>(a, maps, stream);
  }
};

}  // namespace

cudaError_t launch_forward(const FwdArgs& a, bool fp16, int head_dim, cudaStream_t stream) {
  return dispatch<LaunchForward>(fp16, a.bias.fp32, head_dim, a, stream);
}

}  // namespace tpf::attn
