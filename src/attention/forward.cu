// Triangle attention forward: FlashAttention-2 style online softmax in the log2 domain, pair
// bias added to the scores, key mask, outputs O (activation dtype), its rounding residual R and
// the natural-log LSE. One block = one (b, s, h) slice x FwdConfig::kBlockQ query rows.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "attention/dispatch.cuh"
#include "attention/forward_loads.cuh"
#include "attention/forward_math.cuh"
#include "attention/kernels.h"
#include "attention/tma_maps.h"
#include "common/kernel_attrs.h"

namespace tpf::attn {
namespace {

// Per key tile j: wait for its loads and barrier (stage j - 1 is free); S = mask + QK^T (wgmma:
// with the lagged PV of tile j - 1 issued alongside); the loads of tile j + 1 into the other
// stage; + pair bias; online softmax; O += PV. Then the epilogue.
template <class T, class BiasT, int D, bool kTma>
__global__ void __launch_bounds__(FwdCfg<BiasT, D, kTma>::kThreads, (fwd_min_blocks<BiasT, D, kTma>()))
    forward_kernel(const FwdArgs a, const __grid_constant__ FwdMaps maps) {
  using Cfg = FwdCfg<BiasT, D, kTma>;
  using Mma = FwdMma<T, BiasT, D, kTma>;
  using Smem = FwdSmem<T, BiasT, D, kTma>;
  constexpr int BQ = Cfg::kBlockQ, BK = Cfg::kBlockK, NT = BK / 8, DT = D / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr bool kBiasMma = sizeof(BiasT) == 2;  // see add_pair_bias
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const Smem sm(smem_raw);

  // Query tiles vary fastest: the blocks in flight share few slices, whose K/V stay in L2.
  const int q0 = blockIdx.x * BQ, s = blockIdx.y;
  const int b = blockIdx.z / a.dims.H, h = blockIdx.z % a.dims.H;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const FwdLoads<T, BiasT, D, kTma> loads(a, maps, sm, q0, b, s, h, tid);
  KeyMaskStream<BK, Cfg::kThreads> mask(a, b, s, tid, sm.mask);
  mask.start();
  loads.prologue();

  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};  // this thread's rows
  float o[DT][4] = {};                                              // O, 16 rows x D per warp
  float lsum[4] = {};                                               // row sums (FwdMma::ones)
  OnlineSoftmax softmax;
  uint32_t unscale[2] = {};  // B: 1/scale times a doubled identity
  if constexpr (kBiasMma) dev::scaled_identity_b<T>(unscale, 1.f / a.scale, lane);
  const float unit = kBiasMma ? a.scale : 1.f;  // a score unit in natural-log units
  const float to_log2 = unit * kLog2e;
  Mma mma(sm.q, sm.k, sm.v, warp, lane);
  [[maybe_unused]] float(&o_flat)[DT * 4] = reinterpret_cast<float(&)[DT * 4]>(o);  // wgmma's view
  for (int j = 0; j < loads.n_tiles; ++j) {
    const int stage = j % Cfg::kStages;
    loads.wait(j);
    __syncthreads();  // one barrier per tile: every warp has finished tile j - 1
    if (!Mma::kWgmma && j == 0) mma.load_q(sm.q);

    float sc[NT][4];  // [n8 tile][C fragment]: the scores of 16 rows x BK keys per warp
    mask.scores_from_mask(sc, stage, t);
    mma.scores(sc, o_flat, stage, j, dev::smem_addr(sm.k + stage * BK * D));
    loads.next(j, stage);
    mask.advance(j, Cfg::kStages);
    Mma::wait_scores(sc);
    add_pair_bias<T, BiasT, D, kTma>(sc, sm.bias + stage * Smem::kBiasBytes, unscale, a.scale, warp, lane);
    float alpha[2];
    softmax.exponentiate(sc, to_log2, alpha);
    Mma::wait_pv(sc, o_flat);
    OnlineSoftmax::rescale(o, lsum, alpha);
    mma.pv(sc, o, lsum, sm.v + stage * BK * D);
  }
  if constexpr (Mma::kWgmma) {
    loads.wait_last_v();
    mma.finish(o_flat, (loads.n_tiles - 1) % Cfg::kStages);
  }
  write_outputs<T>(a, o, lsum, softmax.m, unit, row, b, s, h, lane);
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
