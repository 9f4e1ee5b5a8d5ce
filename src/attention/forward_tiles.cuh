// The attention forward's tiles (forward.cu): the kernel's configuration from tile_config.h's
// table, the key-mask tile layout, the TMA maps, the shared-memory size and the block's carve of
// it (FwdSmem). The kernel's parts: forward_loads.cuh (load policy, key mask) and
// forward_math.cuh (products, score modifier, online softmax, epilogue).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "attention/kernel_args.h"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"
#include "attention/tma_maps.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"

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
// instructions per warp and tile). Q, K, V: rows of D elements in the 32-, 64- or 128-byte
// swizzle, which is common/swizzle.cuh's layout (the ldmatrix reads) and at D = 32 the one the
// wgmma descriptors read; bias: 128-byte swizzle in parts of 128 bytes of keys (BiasSwz128).
// D = 128's 256-byte rows would need two boxes a row and another layout.
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

// The block's shared memory, in fwd_smem_bytes' order, from a base aligned to the swizzle's
// period (TMA: 1024 bytes, wgmma: 512).
template <class T, class BiasT, int D, bool kTma>
struct FwdSmem {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  using Mask = FwdMask<Cfg::kBlockK>;
  static constexpr int BQ = Cfg::kBlockQ, BK = Cfg::kBlockK;
  static constexpr int kBiasBytes = FwdBiasTile<BiasT, D, kTma>::kBytes;  // a stage
  static constexpr uint32_t kAlign = kTma ? 1024 : fwd_wgmma<BiasT, D>() ? 512 : 1;
  T* q;           // [BQ][D]
  T* k;           // [stages][BK][D]
  T* v;           // [stages][BK][D]
  uint8_t* bias;  // [stages][kBiasBytes]
  float* mask;    // [stages][Mask::kFloats]
  uint32_t bar0;  // TMA: two mbarriers of 8 bytes

  __device__ __forceinline__ explicit FwdSmem(uint8_t* raw) {
    uint8_t* base = raw + ((kAlign - (dev::smem_addr(raw) & (kAlign - 1))) & (kAlign - 1));
    q = reinterpret_cast<T*>(base);
    k = q + BQ * D;
    v = k + Cfg::kStages * BK * D;
    bias = reinterpret_cast<uint8_t*>(v + Cfg::kStages * BK * D);
    mask = reinterpret_cast<float*>(bias + Cfg::kStages * kBiasBytes);
    bar0 = dev::smem_addr(mask + Cfg::kStages * Mask::kFloats);
  }
  // TMA: the copies issued at the top of tile j - 1 (K, bias of tile j, V of tile j - 1; the
  // prologue: Q, K and bias of tile 0) complete on bar(j), phase parity (j / 2) % 2.
  __device__ __forceinline__ uint32_t bar(int batch) const { return bar0 + 8 * (batch & 1); }
  __device__ __forceinline__ static uint32_t bar_parity(int batch) { return static_cast<uint32_t>(batch >> 1) & 1u; }
};

}  // namespace
}  // namespace tpf::attn
