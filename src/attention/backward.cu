// Triangle attention backward, key-tile parallel (DESIGN.md section 1).
//
// A block owns one 64-key tile of one (b, h) and one chunk of slices. Its quads of 4 warps take
// BwdConfig::kSlices consecutive slices side by side and walk all query tiles; each probability
// tile P is recomputed once (from the forward's LSE) and feeds all four gradients:
//   dV += P^T dO, dK += dS^T Q (registers, per slice), dQ += dS K, dbias += sum_s dS.
// dQ: the key tiles of a (slice group, query tile) add their contributions to an fp32 buffer
//     one after another in key-tile order, handed on by a release/acquire turn counter: a fixed
//     order, no float atomics, O(B S H N D) memory.
// dbias: the quads' dS tiles are summed in shared memory in quad order, then added to the
//     block's private fp32 partial of its slice chunk; the chunks are summed in order later.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "attention/kernels.h"
#include "attention/tile_config.h"
#include "attention/tile_io.cuh"

namespace tpf::attn {
namespace {

// Shared memory of one block, in elements; the regions follow one another in this order.
template <int D>
struct BwdSmem {
  using Cfg = BwdConfig<D>;
  static constexpr int G = Cfg::kSlices, BK = Cfg::kBlockK, BQ = Cfg::kBlockQ;
  static constexpr int kBiasStride = BQ + 8;   // fp32 [BK][BQ] rows padded: float2 reads of 8
                                               // rows x 4 lanes hit distinct banks per half-warp
  static constexpr int kK = G * BK * D;        // sK   [G][BK][D]        16-bit, swizzled
  static constexpr int kV = G * BK * D;        // sV   [G][BK][D]
  static constexpr int kQ = 2 * G * BQ * D;    // sQ   [2][G][BQ][D]     double-buffered
  static constexpr int kDO = 2 * G * BQ * D;   // sdO  [2][G][BQ][D]
  static constexpr int kDS = G * BK * BQ;      // sdS  [G][BK][BQ]       dS^T in 16-bit, swizzled
  static constexpr int k16 = kK + kV + kQ + kDO + kDS;
  static constexpr int kLse = 2 * G * BQ;      // sLse [2][G][BQ]        fp32, log2 domain
  static constexpr int kDlt = 2 * G * BQ;      // sDlt [2][G][BQ]
  static constexpr int kBias = BK * kBiasStride;      // sBias [BK][BQ+8]  bias^T * log2(e)
  static constexpr int kDSf = G * BK * kBiasStride;   // sdSf  [G][BK][BQ+8] dS^T in fp32
  static constexpr size_t bytes() {
    return size_t(k16) * 2 + size_t(kLse + kDlt + kBias + kDSf) * 4;
  }
};

template <class T, int D>
__global__ void __launch_bounds__(BwdConfig<D>::kThreads, 1) backward_kernel(const BwdArgs a) {
  using Cfg = BwdConfig<D>;
  using L = BwdSmem<D>;
  using Mma = dev::MmaOp<T>;
  constexpr int G = Cfg::kSlices, BK = Cfg::kBlockK, BQ = Cfg::kBlockQ;
  constexpr int QT = BQ / 8, DT = D / 8, KS = D / 16, BS = L::kBiasStride;
  constexpr int kDqUnits = (BQ / 16) * (D / 16) / 4;  // 16x16 blocks of dQ per warp (>= 1 for D>=32)
  constexpr int kDqUnitsPerWarp = kDqUnits > 0 ? kDqUnits : 1;

  extern __shared__ __align__(128) uint8_t smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + L::kK;
  T* sQ = sV + L::kV;
  T* sdO = sQ + L::kQ;
  T* sdS = sdO + L::kDO;
  float* sLse = reinterpret_cast<float*>(sdS + L::kDS);
  float* sDlt = sLse + L::kLse;
  float* sBias = sDlt + L::kDlt;
  float* sdSf = sBias + L::kBias;

  const int N = a.dims.N, S = a.dims.S, H = a.dims.H;
  const int kb = blockIdx.x, chunk = blockIdx.y;
  const int b = blockIdx.z / H, h = blockIdx.z % H;
  const int k0 = kb * BK;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int quad = warp / 4, wq = warp % 4, qtid = tid % 128;
  const int n_sg = (S + G - 1) / G, nq = (N + BQ - 1) / BQ;
  const int sg_begin = chunk * a.groups_per_chunk;
  const int sg_end = min(n_sg, sg_begin + a.groups_per_chunk);
  const int64_t bias_base = b * a.bias.sb + h * a.bias.sh;
  float* dbias_part =
      a.dbias_part ? a.dbias_part + ((static_cast<int64_t>(chunk) * a.dims.B + b) * H + h) *
                                        static_cast<int64_t>(N) * N
                   : nullptr;
  // This warp's 16 keys: thread rows krow[0] = g, krow[1] = g + 8 of the warp's block.
  const int krow[2] = {wq * 16 + g, wq * 16 + g + 8};

  T* qK = sK + quad * BK * D;  // this quad's slice tiles
  T* qV = sV + quad * BK * D;
  T* qdS = sdS + quad * BK * BQ;
  float* qdSf = sdSf + quad * BK * BS;

  for (int sg = sg_begin; sg < sg_end; ++sg) {
    const int s = sg * G + quad;
    const bool active = s < S;
    const int s_ld = active ? s : 0;  // inactive quads read slice 0 but keep zero rows
    const int rows = active ? N : 0;
    const T* gQ = slice_ptr<T>(a.q, b, s_ld, h);
    const T* gdO = slice_ptr<T>(a.dout, b, s_ld, h);
    const int64_t row_base = ((static_cast<int64_t>(b) * S + s_ld) * H + h) * N;  // [B,S,H,N]

    // Load query tile `qi` of this quad's slice (Q, dO, LSE, Dlt) into stage `st`.
    auto load_q = [&](int qi, int st) {
      load_tile_async<D, BQ, 128>(sQ + (st * G + quad) * BQ * D, gQ, a.q.sn, qi * BQ, rows, qtid);
      load_tile_async<D, BQ, 128>(sdO + (st * G + quad) * BQ * D, gdO, a.dout.sn, qi * BQ, rows,
                                  qtid);
      if (qtid < BQ) {
        const int q = qi * BQ + qtid;
        const bool ok = q < rows;
        sLse[(st * G + quad) * BQ + qtid] = ok ? a.lse[row_base + q] * 1.4426950408889634f : INFINITY;
        sDlt[(st * G + quad) * BQ + qtid] = ok ? a.delta[row_base + q] : 0.f;
      }
    };

    load_tile_async<D, BK, 128>(qK, slice_ptr<T>(a.k, b, s_ld, h), a.k.sn, k0, rows, qtid);
    load_tile_async<D, BK, 128>(qV, slice_ptr<T>(a.v, b, s_ld, h), a.v.sn, k0, rows, qtid);
    load_q(0, 0);
    dev::cp_async_commit();
    bool attend[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) attend[r] = active && key_attended(a.mask, b, s_ld, k0 + krow[r], N);

    float dk[DT][4] = {}, dv[DT][4] = {};  // 16 keys x D per warp, this quad's slice

    for (int qi = 0; qi < nq; ++qi) {
      const int st = qi & 1, q0 = qi * BQ;
      if (qi + 1 < nq) load_q(qi + 1, st ^ 1);
      dev::cp_async_commit();
      for (int i = tid; i < BK * BQ; i += Cfg::kThreads) {  // bias^T tile, shared by all quads
        const int k = i % BK, q = i / BK;
        sBias[k * BS + q] = load_bias_log2<T>(a.bias, bias_base, q0 + q, k0 + k, N);
      }
      dev::cp_async_wait<1>();
      __syncthreads();

      const T* tQ = sQ + (st * G + quad) * BQ * D;
      const T* tdO = sdO + (st * G + quad) * BQ * D;
      const float* tLse = sLse + (st * G + quad) * BQ;
      const float* tDlt = sDlt + (st * G + quad) * BQ;

      // S^T = K Q^T and dP^T = V dO^T: 16 keys x BQ queries per warp.
      float sT[QT][4] = {}, dpT[QT][4] = {};
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t ka[4], va[4];
        dev::ldmatrix_x4(ka, tile_at<D>(qK, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                        ks * 2 + (lane >> 4)));
        dev::ldmatrix_x4(va, tile_at<D>(qV, wq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                        ks * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < QT / 2; ++np) {
          uint32_t qb[4], ob[4];
          const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
          dev::ldmatrix_x4(qb, tile_at<D>(tQ, r, c));
          dev::ldmatrix_x4(ob, tile_at<D>(tdO, r, c));
          Mma::run(sT[2 * np], ka, qb[0], qb[1]);
          Mma::run(sT[2 * np + 1], ka, qb[2], qb[3]);
          Mma::run(dpT[2 * np], va, ob[0], ob[1]);
          Mma::run(dpT[2 * np + 1], va, ob[2], ob[3]);
        }
      }

      // P^T = exp2(S^T * scale * log2e + bias * log2e - LSE * log2e); dS^T = P^T (dP^T - Dlt).
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, q = nt * 8 + 2 * t + (e & 1);
          const float x = fmaf(sT[nt][e], a.scale_log2, sBias[krow[r] * BS + q]) - tLse[q];
          const float p = attend[r] ? dev::exp2_approx(x) : 0.f;
          sT[nt][e] = p;
          dpT[nt][e] = p * (dpT[nt][e] - tDlt[q]);
        }

      // dV += P^T dO and dK += dS^T Q (the 16-bit P^T, dS^T as A operands, straight from registers).
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t pa[4], sa[4];
        dev::acc_to_a<T>(pa, sT[2 * kk], sT[2 * kk + 1]);
        dev::acc_to_a<T>(sa, dpT[2 * kk], dpT[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t ob[4], qb[4];
          const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 2 + (lane >> 4);
          dev::ldmatrix_x4_trans(ob, tile_at<D>(tdO, r, c));
          dev::ldmatrix_x4_trans(qb, tile_at<D>(tQ, r, c));
          Mma::run(dv[2 * dp], pa, ob[0], ob[1]);
          Mma::run(dv[2 * dp + 1], pa, ob[2], ob[3]);
          Mma::run(dk[2 * dp], sa, qb[0], qb[1]);
          Mma::run(dk[2 * dp + 1], sa, qb[2], qb[3]);
        }
      }

      // dS^T to shared memory: 16-bit for dQ = dS K, fp32 for the bias gradient.
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float d0 = dpT[nt][2 * r], d1 = dpT[nt][2 * r + 1];
          *reinterpret_cast<uint32_t*>(tile_at<BQ>(qdS, krow[r], nt) + 2 * t) = Mma::pack(d0, d1);
          *reinterpret_cast<float2*>(qdSf + krow[r] * BS + nt * 8 + 2 * t) = make_float2(d0, d1);
        }
      __syncthreads();

      // dQ contribution of this key tile: dS (BQ x BK) K (BK x D), in 16 x 16 units per warp.
      float dq[kDqUnitsPerWarp][2][4] = {};
      const bool dq_warp = kDqUnits > 0 || wq < (BQ / 16) * (D / 16);
#pragma unroll
      for (int u = 0; u < kDqUnitsPerWarp; ++u) {
        const int unit = wq + 4 * u, qg = unit % (BQ / 16), dg = unit / (BQ / 16);
        if (!dq_warp) break;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          uint32_t sa[4], kb4[4];
          dev::ldmatrix_x4_trans(sa, tile_at<BQ>(qdS, kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                 qg * 2 + ((lane >> 3) & 1)));
          dev::ldmatrix_x4_trans(kb4, tile_at<D>(qK, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                 dg * 2 + (lane >> 4)));
          Mma::run(dq[u][0], sa, kb4[0], kb4[1]);
          Mma::run(dq[u][1], sa, kb4[2], kb4[3]);
        }
      }

      // Bias gradient: sum the quads' dS tiles in quad order, add to this block's partial.
      if (dbias_part) {
        const bool first = sg == sg_begin;
        for (int i = tid; i < BK * BQ; i += Cfg::kThreads) {
          const int k = i / BQ, q = i % BQ;
          float sum = 0.f;
#pragma unroll
          for (int quad_i = 0; quad_i < G; ++quad_i) sum += sdSf[quad_i * BK * BS + k * BS + q];
          if (k0 + k < N && q0 + q < N) {
            float* p = dbias_part + static_cast<int64_t>(k0 + k) * N + q0 + q;
            *p = first ? sum : *p + sum;
          }
        }
      }

      // dQ: wait for the previous key tile's turn, add, hand the turn on.
      int* turn = a.dq_turn + ((static_cast<int64_t>(b) * H + h) * n_sg + sg) * nq + qi;
      if (kb > 0) {
        if (tid == 0)
          while (dev::ld_acquire_gpu(turn) != kb) {
          }
        __syncthreads();
      }
      if (active && dq_warp) {
        float* acc = a.dq_acc + row_base * D;
#pragma unroll
        for (int u = 0; u < kDqUnitsPerWarp; ++u) {
          const int unit = wq + 4 * u, qg = unit % (BQ / 16), dg = unit / (BQ / 16);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int q = q0 + qg * 16 + g + 8 * r;
            if (q >= N) continue;
#pragma unroll
            for (int n = 0; n < 2; ++n) {
              float2* p = reinterpret_cast<float2*>(acc + static_cast<int64_t>(q) * D + dg * 16 +
                                                    n * 8 + 2 * t);
              float2 v = make_float2(dq[u][n][2 * r], dq[u][n][2 * r + 1]);
              if (kb > 0) {
                const float2 old = *p;
                v.x += old.x;
                v.y += old.y;
              }
              *p = v;
            }
          }
        }
      }
      __threadfence();
      __syncthreads();  // also ends every read of this step's shared tiles
      if (tid == 0) dev::st_release_gpu(turn, kb + 1);
    }

    // dK = scale * dS^T Q and dV, complete for this slice: store.
    if (active) {
      T* gdK = slice_ptr_mut<T>(a.dk, b, s, h);
      T* gdV = slice_ptr_mut<T>(a.dv, b, s, h);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int k = k0 + krow[r];
        if (k >= N) continue;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int d = dt * 8 + 2 * t;
          *reinterpret_cast<uint32_t*>(gdK + k * a.dk.sn + d) =
              Mma::pack(dk[dt][2 * r] * a.scale, dk[dt][2 * r + 1] * a.scale);
          *reinterpret_cast<uint32_t*>(gdV + k * a.dv.sn + d) =
              Mma::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
        }
      }
    }
    __syncthreads();  // the next slice group reloads sK, sV
  }
}

template <class T, int D>
cudaError_t launch_main(const BwdArgs& a, const BwdPlan& plan, cudaStream_t stream) {
  const size_t smem = BwdSmem<D>::bytes();
  auto kernel = backward_kernel<T, D>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(plan.key_tiles, plan.chunks, a.dims.B * a.dims.H);
  kernel<<<grid, BwdConfig<D>::kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int D>
BwdPlan plan_for(const Dims& d) {
  using Cfg = BwdConfig<D>;
  BwdPlan p;
  p.slice_groups = (d.S + Cfg::kSlices - 1) / Cfg::kSlices;
  p.query_tiles = (d.N + Cfg::kBlockQ - 1) / Cfg::kBlockQ;
  p.key_tiles = (d.N + Cfg::kBlockK - 1) / Cfg::kBlockK;
  const int64_t per_chunk_blocks = static_cast<int64_t>(d.B) * d.H * p.key_tiles;
  int chunks = static_cast<int>(
      std::clamp<int64_t>((kBwdTargetBlocks + per_chunk_blocks - 1) / per_chunk_blocks, 1,
                          p.slice_groups));
  p.groups_per_chunk = (p.slice_groups + chunks - 1) / chunks;
  p.chunks = (p.slice_groups + p.groups_per_chunk - 1) / p.groups_per_chunk;
  return p;
}

}  // namespace

BwdPlan plan_backward(const Dims& d, int head_dim) {
  switch (head_dim) {
    case 16: return plan_for<16>(d);
    case 32: return plan_for<32>(d);
    case 64: return plan_for<64>(d);
    default: return plan_for<128>(d);
  }
}

cudaError_t launch_backward_preprocess(const BwdArgs& a, bool fp16, int head_dim,
                                       cudaStream_t stream);
cudaError_t launch_backward_reduce(const BwdArgs& a, bool fp16, int head_dim,
                                   cudaStream_t stream);

cudaError_t launch_backward(const BwdArgs& a, bool fp16, int head_dim, cudaStream_t stream) {
  const BwdPlan plan = plan_backward(a.dims, head_dim);
  cudaError_t e = launch_backward_preprocess(a, fp16, head_dim, stream);
  if (e != cudaSuccess) return e;
  switch (head_dim) {
    case 16: e = fp16 ? launch_main<__half, 16>(a, plan, stream) : launch_main<__nv_bfloat16, 16>(a, plan, stream); break;
    case 32: e = fp16 ? launch_main<__half, 32>(a, plan, stream) : launch_main<__nv_bfloat16, 32>(a, plan, stream); break;
    case 64: e = fp16 ? launch_main<__half, 64>(a, plan, stream) : launch_main<__nv_bfloat16, 64>(a, plan, stream); break;
    case 128: e = fp16 ? launch_main<__half, 128>(a, plan, stream) : launch_main<__nv_bfloat16, 128>(a, plan, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (e != cudaSuccess) return e;
  return launch_backward_reduce(a, fp16, head_dim, stream);
}

}  // namespace tpf::attn
