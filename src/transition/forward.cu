// The fused SwiGLU transition forward on Hopper (sm_90a). One persistent block per SM walks
// 128-row tiles; each of its two warpgroups owns 64 rows of a tile.
//
// A tile: TMA brings its x (prefetched during the previous tile); the LayerNorm writes xhat as
// a bf16 wgmma operand in shared memory; then for each hidden chunk j of kChunk units
//   [a | b]_j = xhat W_ab,j^T      m64n128k16 x 8, both operands in shared memory
//   h_j = silu(a_j) b_j             in registers, as the A fragments of
//   y += h_j W_o,j^T                m64n128k16 x 4, A from registers
// and the epilogue rounds y, stages it in xhat's place and writes x + scale y row by row. A
// producer warpgroup's thread streams the W_ab and W_o chunks from L2 by TMA into two stages each, refilled
// as soon as both warpgroups' wgmma reading them are waited for, so that the warpgroups drift
// apart and one's SwiGLU runs under the other's products; the down projection of chunk j also
// runs under the up projection of chunk j + 1.
//
// Floor at N = 768 (589,824 rows, H = 512): 196,608 multiply-adds a row, 232 GFLOP, 0.29 ms
// at the ~790 TFLOP/s measured on random data; x read, out (fp32) and xhat written, 0.75 GB,
// 0.17 ms at 4.3 TB/s. The weights (384 KB) are read from L2 once a tile: ~3 KB a row.
#include "activation/gate_math.cuh"
#include "common/kernel_attrs.h"
#include "common/row_math.cuh"
#include "transition/parts.cuh"

namespace tpf::transition {
namespace {

constexpr int kGroupLanes = rows::kGroupLanes;   // lanes of a row in the row passes
constexpr int kRowsPerPass = 128 / kGroupLanes;  // rows a warpgroup covers in one pass

// Shared memory, byte offsets from a 1024-byte aligned base (the 128-byte swizzle's period).
template <class Tx>
struct Layout {
  static constexpr uint32_t x = 0;                              // Tx [128 rows][C], TMA box
  static constexpr uint32_t xhat = kRows * kC * sizeof(Tx);     // bf16 [2 halves][128][64]; then y
  static constexpr uint32_t ab = xhat + 2 * kHalf;              // 2 stages of kAbStage
  static constexpr uint32_t o = ab + 2 * kAbStage;              // 2 stages of kOStage
  static constexpr uint32_t params = o + 2 * kOStage;           // fp32 [ln_w | ln_b]
  static constexpr uint32_t bars = params + 2 * kC * 4;         // mbarriers: x full, empty; rings
  static constexpr uint32_t ab_bars = bars + 16, o_bars = ab_bars + 2 * kRingBarBytes;
  static constexpr uint32_t bytes = o_bars + 2 * kRingBarBytes + 1024;  // + the alignment slack
};

struct Maps {
  CUtensorMap x, w_ab, w_o;
};

// The x tile's barriers: full (TMA) and empty (every consumer normalised its rows).
template <class Tx>
__device__ uint32_t x_full(uint32_t base) { return base + Layout<Tx>::bars; }
template <class Tx>
__device__ uint32_t x_empty(uint32_t base) { return base + Layout<Tx>::bars + 8; }

template <class Tx>
__device__ void load_x(const Maps& m, uint32_t base, int64_t tile) {
  dev::mbar_arrive_expect_tx(x_full<Tx>(base), kRows * kC * sizeof(Tx));
  dev::tma_load_2d(base + Layout<Tx>::x, &m.x, x_full<Tx>(base), 0, static_cast<int>(tile * kRows));
}

// The producer: x tile by tile, the weight chunks two ahead of the consumers (the rings' depth).
// Tile it + 1's x goes once tile it is normalised, after chunk min(1, nch - 1)'s weights.
template <class Tx>
__device__ void produce(const Maps& m, uint32_t base, const WeightLoads& ld, int my_tiles) {
  load_x<Tx>(m, base, blockIdx.x);
  for (int it = 0, q = 0; it < my_tiles; ++it)
    for (int j = 0; j < ld.nch; ++j, ++q) {
      ld.load_ab(q);
      ld.load_o(q);
      if (j == min(1, ld.nch - 1) && it + 1 < my_tiles) {
        dev::mbar_wait(x_empty<Tx>(base), it & 1);
        load_x<Tx>(m, base, blockIdx.x + int64_t(it + 1) * gridDim.x);
      }
    }
}

// The LayerNorm of the warpgroup's 64 rows: xhat into shared memory (and global), the stats.
// Rows past the end hold TMA's zeros and are normalised harmlessly, never stored.
template <class Tx>
__device__ void normalize_rows(uint8_t* smem, const FwdArgs& a, int64_t m0, int wg, int tl) {
  using L = Layout<Tx>;
  const Tx* xs = reinterpret_cast<const Tx*>(smem + L::x);  // [128][C]
  const float* w = reinterpret_cast<const float*>(smem + L::params);
  bf16* xh = reinterpret_cast<bf16*>(smem + L::xhat);
  const int l = tl % kGroupLanes;
#pragma unroll 1
  for (int p = 0; p < 64 / kRowsPerPass; ++p) {
    const int r = 64 * wg + kRowsPerPass * p + tl / kGroupLanes;
    const int64_t row = m0 + r;
    float v[kC / kGroupLanes];  // [4u + e] channel unit_channel(l, u) + e
#pragma unroll
    for (int u = 0; u < kC / (4 * kGroupLanes); ++u) rows::load4(v + 4 * u, xs + r * kC + rows::unit_channel(l, u), true);
    const float2 st = rows::row_stats(v, kC, a.eps);
#pragma unroll
    for (int u = 0; u < kC / (4 * kGroupLanes); ++u) {
      const int c = rows::unit_channel(l, u);
      float o[4];  // [e] channel c + e
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = (v[4 * u + e] - st.x) * st.y * w[c + e] + w[kC + c + e];
      rows::store4(half_tile_at(xh, r, c), o, true);
      if (a.xhat && row < a.rows) rows::store4(a.xhat + row * kC + c, o, true);
    }
    if (l == 0 && row < a.rows) {
      if (a.mean) a.mean[row] = st.x;
      if (a.rstd) a.rstd[row] = st.y;
    }
  }
}

// h = silu(a) b from the accumulators (a: columns 0-63, b: 64-127, each rounded to bf16 as the
// unfused path stores them), as the A fragments of the down projection's 4 k16 steps.
__device__ __forceinline__ void swiglu_fragments(uint32_t (&h)[4][4], const float (&acc)[64]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    float v[2][4];  // [n8 tile 2 kk + i][accumulator element]
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = round_bf16(acc[4 * (2 * kk + i) + e]), b = round_bf16(acc[4 * (2 * kk + i + 8) + e]);
        v[i][e] = act::Act<act::Gate::kSilu>::value(x, act::sigmoid(x)) * b;
      }
    dev::acc_to_a<bf16>(h[kk], v[0], v[1]);
  }
}

// y += h W_o,j^T: 4 k16 steps over the chunk's 64 hidden units (issued, not waited).
__device__ __forceinline__ void down_projection(float (&y)[64], const uint32_t (&h)[4][4], uint32_t w_o, bool first) {
  dev::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk)
    dev::WgmmaN128RS<0>::run(y, h[kk], dev::wgmma_desc(w_o + 32 * kk, 16, 1024), !(first && kk == 0));
  dev::wgmma_commit();
}

// out = x + scale y (or y) for the warpgroup's 64 rows: the residual's x rows are loaded
// first (all of them, so that one latency covers the tile), y is rounded to bf16 and staged in
// xhat's place (this warpgroup's rows only), then everything is written row by row in 16-byte
// pieces.
template <class Tx>
__device__ void store_rows(uint8_t* smem, const FwdArgs& a, const float (&y)[64], int64_t m0, int wg, int tl) {
  constexpr int kPasses = 64 / kRowsPerPass, kUnits = kC / (4 * kGroupLanes);
  bf16* ys = reinterpret_cast<bf16*>(smem + Layout<Tx>::xhat);
  const int w = tl / 32, g = (tl % 32) / 4, t = tl % 4, l = tl % kGroupLanes;
  float xv[kPasses][kUnits][4] = {}, s[kPasses];  // this lane's x (channel unit_channel(l, u) + e) and scale
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t row = m0 + 64 * wg + kRowsPerPass * p + tl / kGroupLanes;
    s[p] = a.scale && row < a.rows ? a.scale[row] : 1.f;
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
      if (a.residual && row < a.rows) rows::load4(xv[p][u], static_cast<const Tx*>(a.x) + row * kC + rows::unit_channel(l, u), true);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
      *reinterpret_cast<uint32_t*>(half_tile_at(ys, 64 * wg + 16 * w + g + 8 * hr, 8 * i + 2 * t)) =
          dev::MmaOp<bf16>::pack(y[4 * i + 2 * hr], y[4 * i + 2 * hr + 1]);
  dev::bar_sync(1 + wg, 128);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int r = 64 * wg + kRowsPerPass * p + tl / kGroupLanes;
    const int64_t row = m0 + r;
    if (row >= a.rows) break;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int c = rows::unit_channel(l, u);
      float v[4];  // [e] channel c + e
      rows::load4(v, half_tile_at(ys, r, c), true);
      if (a.residual) {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = xv[p][u][e] + s[p] * v[e];
        rows::store4(static_cast<Tx*>(a.out) + row * kC + c, v, true);
      } else {
        rows::store4(static_cast<bf16*>(a.out) + row * kC + c, v, true);
      }
    }
  }
}

// The consumers: per tile the LayerNorm, then per chunk the up projection, SwiGLU and the down
// projection, whose stage is released when the next chunk's wait covers it; then the epilogue.
template <class Tx>
__device__ void consume(uint8_t* smem, uint32_t base, const FwdArgs& a, const WeightLoads& ld, int my_tiles) {
  using L = Layout<Tx>;
  const int wg = threadIdx.x / 128, tl = threadIdx.x % 128;
  float y[64], acc[64];  // the m64n128 accumulator layout (common/wgmma.cuh)
  uint32_t h[4][4];      // [k16 step][A fragment]
  for (int it = 0, q = 0; it < my_tiles; ++it) {
    const int64_t m0 = (blockIdx.x + int64_t(it) * gridDim.x) * kRows;
    dev::mbar_wait(x_full<Tx>(base), it & 1);
    normalize_rows<Tx>(smem, a, m0, wg, tl);
    dev::mbar_arrive(x_empty<Tx>(base));
    dev::fence_proxy_async();       // xhat's st.shared, visible to wgmma
    dev::bar_sync(1 + wg, 128);     // the warpgroup's rows are all written
    for (int j = 0; j < ld.nch; ++j, ++q) {
      dev::wgmma_fence();
      up_projection(acc, base + L::xhat, ld.ab.wait(q), wg);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();  // this chunk's up projection and the previous chunk's down projection
      dev::wgmma_fence_operands(acc);
      dev::wgmma_fence_operands(y);
      keep_fragments(h);
      ld.ab.release(q);
      if (j > 0) ld.o.release(q - 1);
      swiglu_fragments(h, acc);
      down_projection(y, h, ld.o.wait(q), j == 0);
    }
    dev::wgmma_wait<0>();
    dev::wgmma_fence_operands(y);
    keep_fragments(h);
    ld.o.release(q - 1);
    store_rows<Tx>(smem, a, y, m0, wg, tl);
  }
}

template <class Tx>
__global__ void __launch_bounds__(kBlockThreads, 1) forward_kernel(const FwdArgs a, const __grid_constant__ Maps m) {
  using L = Layout<Tx>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = align_1024(smem_raw);
  const uint32_t base = dev::smem_addr(smem);
  const int my_tiles = block_tiles(a.rows);
  const WeightLoads ld{&m.w_ab, &m.w_o, {base + L::ab, base + L::ab_bars, kAbStage, 2},
                       {base + L::o, base + L::o_bars, kOStage, 2}, a.H, a.H / kChunk};
  float* params = reinterpret_cast<float*>(smem + L::params);
  for (int c = threadIdx.x; c < kC; c += kBlockThreads)
    params[c] = a.ln_w ? a.ln_w[c] : 1.f, params[kC + c] = a.ln_b ? a.ln_b[c] : 0.f;
  run_roles(
      ld,
      [&] {
        dev::mbar_init(x_full<Tx>(base), 1);
        dev::mbar_init(x_empty<Tx>(base), kConsumers);
      },
      [&] { produce<Tx>(m, base, ld, my_tiles); }, [&] { consume<Tx>(smem, base, a, ld, my_tiles); });
}

template <class Tx>
cudaError_t launch(const FwdArgs& a, cudaStream_t stream) {
  Maps m;
  constexpr bool kF32 = sizeof(Tx) == 4;
  const auto x_type = kF32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (!encode_rows(&m.x, a.x, x_type, sizeof(Tx), a.rows, kC, kC, kRows, CU_TENSOR_MAP_SWIZZLE_NONE) ||
      !encode_weights(&m.w_ab, &m.w_o, a.w_ab, a.w_o, a.H))
    return cudaErrorNotSupported;
  constexpr int kBytes = Layout<Tx>::bytes;
  unsigned blocks = 0;
  cudaError_t e;
  if ((e = tpf::detail::persistent_grid(tile_count(a.rows), 1, &blocks)) != cudaSuccess) return e;
  if ((e = detail::allow_dynamic_smem(forward_kernel<Tx>, kBytes)) != cudaSuccess) return e;
  forward_kernel<Tx><<<blocks, kBlockThreads, kBytes, stream>>>(a, m);
  return cudaGetLastError();
}

}  // namespace

cudaError_t forward(const FwdArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  return a.x_dtype == DType::kFP32 ? launch<float>(a, stream) : launch<bf16>(a, stream);
}

}  // namespace tpf::transition
