// The fused SwiGLU transition backward's middle on Hopper (sm_90a): from xhat (saved by the
// forward) and g, the gradient of the down projection's output, per 128-row tile and hidden
// chunk j of kChunk units
//   [a | b]_j = xhat W_ab,j^T      m64n128k16 x 8 (recomputed; shared memory operands)
//   dh_j = g W_o,j                 m64n64k16 x 8 (W_o's chunk read MN-major)
//   h, da, db                      in registers: SwiGLU's backward, the unfused kernel's math
//   dxhat += [da | db]_j W_ab,j    m64n128k16 x 8, A from registers, W_ab's chunk read MN-major
// writing h and [da | db] (the weight gradients' operands, summed by the GEMMs after; staged per
// warp in shared memory for 16-byte stores) and dxhat (the LayerNorm backward's input). The
// [rows, 2H] activation is never read back from memory.
//
// Floor at N = 768 (589,824 rows, H = 512): 327,680 multiply-adds a row, 387 GFLOP, 0.49 ms at
// ~790 TFLOP/s; xhat and g read, h, [da | db] and dxhat written, 2.1 GB, 0.49 ms at 4.3 TB/s.
#include "activation/gate_math.cuh"
#include "common/kernel_attrs.h"
#include "transition/parts.cuh"

namespace tpf::transition {
namespace {

constexpr int kAbStages = 2;
constexpr int kOStages = 2;
constexpr uint32_t kWarpTile = 16 * 64 * 2;    // a warp's 16 rows of 64 bf16, 128B-swizzled: 2 KB
constexpr uint32_t kWarpStage = 3 * kWarpTile;  // its h, da and db of one chunk

// Shared memory, byte offsets from a 1024-byte aligned base.
struct Layout {
  static constexpr uint32_t xhat = 0;                      // bf16 [2 halves][128][64], TMA
  static constexpr uint32_t g = xhat + 2 * kHalf;          // bf16 [2 halves][128][64], TMA
  static constexpr uint32_t ab = g + 2 * kHalf;            // kAbStages of kAbStage
  static constexpr uint32_t o = ab + kAbStages * kAbStage;  // kOStages of kOStage
  static constexpr uint32_t stage = o + kOStages * kOStage;  // 8 warps x kWarpStage: h, da, db
  static constexpr uint32_t bars = stage + 8 * kWarpStage;   // mbarriers: inputs full, empty; rings
  static constexpr uint32_t ab_bars = bars + 16, o_bars = ab_bars + kAbStages * kRingBarBytes;
  static constexpr uint32_t bytes = o_bars + kOStages * kRingBarBytes + 1024;
};

struct Maps {
  CUtensorMap xhat, g, w_ab, w_o;
};

// The input tiles' barriers: full (TMA) and empty (every consumer's last products waited for).
__device__ uint32_t in_full(uint32_t base) { return base + Layout::bars; }
__device__ uint32_t in_empty(uint32_t base) { return base + Layout::bars + 8; }

// A tile's xhat and g: [64 c][128 rows] boxes into the two halves of each.
__device__ void load_inputs(const Maps& m, uint32_t base, int64_t tile) {
  const uint32_t bar = in_full(base);
  const int row = static_cast<int>(tile * kRows);
  dev::mbar_arrive_expect_tx(bar, 4 * kHalf);
#pragma unroll
  for (int kh = 0; kh < 2; ++kh) {
    dev::tma_load_2d(base + Layout::xhat + kh * kHalf, &m.xhat, bar, 64 * kh, row);
    dev::tma_load_2d(base + Layout::g + kh * kHalf, &m.g, bar, 64 * kh, row);
  }
}

// dh = g W_o,j for the warpgroup's 64 rows (K = C): W_o's chunk [128 c][64 h] is B MN-major.
__device__ __forceinline__ void hidden_grad(float (&dh)[32], uint32_t g, uint32_t w_o, int wg) {
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk)
    dev::WgmmaSS<bf16, 64, 0, 1>::run(
        dh, dev::wgmma_desc(g + (kk / 4) * kHalf + 64 * wg * 128 + 32 * (kk % 4), 16, 1024),
        dev::wgmma_desc(w_o + 2048 * kk, kHalf, 1024), kk > 0);
}

// SwiGLU's backward on the accumulators (a: columns 0-63 of acc, b: 64-127, dh: 0-63), each
// rounded to bf16 as the unfused path stores them: h, da and db staged in the warp's tiles
// (rows g, g + 8 of its 16), and [da | db] as the A fragments of dxhat's 8 k16 steps (da's 4,
// then db's).
__device__ __forceinline__ void swiglu_backward(uint32_t (&d)[8][4], const float (&acc)[64], const float (&dh)[32],
                                                bf16* stage, int g, int t) {
  using A = act::Act<act::Gate::kSilu>;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t h2[2], da2[2], db2[2];  // [row g, g + 8]: columns 8 i + 2 t, + 1 as bf16 pairs
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float da[2], db[2], h[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int k = 4 * i + 2 * hr + e;
        const float x = round_bf16(acc[k]), b = round_bf16(acc[k + 32]), gd = round_bf16(dh[k]);
        const float s = act::sigmoid(x), f = A::value(x, s);
        da[e] = gd * b * A::slope(x, s), db[e] = gd * f, h[e] = f * b;
      }
      h2[hr] = dev::MmaOp<bf16>::pack(h[0], h[1]);
      da2[hr] = dev::MmaOp<bf16>::pack(da[0], da[1]);
      db2[hr] = dev::MmaOp<bf16>::pack(db[0], db[1]);
      const int r = g + 8 * hr;
      *reinterpret_cast<uint32_t*>(dev::tile_at<64>(stage, r, i) + 2 * t) = h2[hr];
      *reinterpret_cast<uint32_t*>(dev::tile_at<64>(stage + kWarpTile / 2, r, i) + 2 * t) = da2[hr];
      *reinterpret_cast<uint32_t*>(dev::tile_at<64>(stage + kWarpTile, r, i) + 2 * t) = db2[hr];
    }
    // acc_to_a's order: tile 2 kk gives fragments 0, 1 (rows g, g + 8), tile 2 kk + 1 gives 2, 3
    d[i / 2][2 * (i % 2)] = da2[0], d[i / 2][2 * (i % 2) + 1] = da2[1];
    d[4 + i / 2][2 * (i % 2)] = db2[0], d[4 + i / 2][2 * (i % 2) + 1] = db2[1];
  }
}

// The warp's staged h, da, db rows to memory in 16-byte pieces (8 lanes a 128-byte row piece).
__device__ __forceinline__ void store_hidden(const BwdArgs& a, const bf16* stage, int64_t row0, int j, int lane) {
#pragma unroll
  for (int m = 0; m < 12; ++m) {
    const int k = lane + 32 * m, tile = k / 128, r = (k % 128) / 8, c = k % 8;
    const int64_t row = row0 + r;
    if (row >= a.rows) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(dev::tile_at<64>(stage + tile * (kWarpTile / 2), r, c));
    bf16* dst = tile == 0 ? a.h + row * a.H : a.dab + row * 2 * a.H + (tile == 2 ? a.H : 0);
    *reinterpret_cast<uint4*>(dst + j * kChunk + 8 * c) = v;
  }
}

// dxhat += [da | db] W_ab,j: K = the chunk's 128 W_ab rows, W_ab's stage is B MN-major (its two
// c halves 16 KB apart).
__device__ __forceinline__ void input_grad(float (&dx)[64], const uint32_t (&d)[8][4], uint32_t w_ab, bool first) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    dev::WgmmaN128RS<1>::run(dx, d[kk], dev::wgmma_desc(w_ab + 2048 * kk, kHalf, 1024), !(first && kk == 0));
}

// dxhat (bf16) from the accumulators: rows row0 and row0 + 8, columns 8 i + 2 t, + 1.
__device__ __forceinline__ void store_dxhat(const BwdArgs& a, const float (&dx)[64], int64_t row0, int t) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int64_t row = row0 + 8 * hr;
    if (row >= a.rows) continue;
#pragma unroll
    for (int i = 0; i < kC / 8; ++i)
      *reinterpret_cast<uint32_t*>(a.dxhat + row * kC + 8 * i + 2 * t) =
          dev::MmaOp<bf16>::pack(dx[4 * i + 2 * hr], dx[4 * i + 2 * hr + 1]);
  }
}

// The producer: the weight chunks as far ahead as the rings allow; tile it's inputs once tile
// it - 1's last products are done, after chunk (it, 0)'s weights.
__device__ void produce(const Maps& m, uint32_t base, const WeightLoads& ld, int my_tiles) {
  load_inputs(m, base, blockIdx.x);
  for (int it = 0, q = 0; it < my_tiles; ++it)
    for (int j = 0; j < ld.nch; ++j, ++q) {
      ld.load_ab(q);
      ld.load_o(q);
      if (j == 0 && it > 0) {
        dev::mbar_wait(in_empty(base), (it - 1) & 1);
        load_inputs(m, base, blockIdx.x + int64_t(it) * gridDim.x);
      }
    }
}

// The consumers: per chunk the two recomputing products, SwiGLU's backward, then dxhat's
// product, whose W_ab stage is released when the next chunk's wait covers it.
__device__ void consume(uint8_t* smem_base, uint32_t base, const BwdArgs& a, const WeightLoads& ld, int my_tiles) {
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  bf16* stage = reinterpret_cast<bf16*>(smem_base) + (Layout::stage + (threadIdx.x / 32) * kWarpStage) / 2;
  float acc[64], dh[32], dx[64];  // the wgmma accumulator layouts (common/wgmma.cuh)
  uint32_t d[8][4];               // [k16 step][A fragment] of [da | db]
  for (int it = 0, q = 0; it < my_tiles; ++it) {
    const int64_t warp_row0 = (blockIdx.x + int64_t(it) * gridDim.x) * kRows + 64 * wg + 16 * warp, row0 = warp_row0 + g;
    dev::mbar_wait(in_full(base), it & 1);
    for (int j = 0; j < ld.nch; ++j, ++q) {
      const uint32_t w_ab = ld.ab.wait(q);
      dev::wgmma_fence();
      up_projection(acc, base + Layout::xhat, w_ab, wg);
      hidden_grad(dh, base + Layout::g, ld.o.wait(q), wg);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();  // these two and the previous chunk's input gradient
      dev::wgmma_fence_operands(acc);
      dev::wgmma_fence_operands(dh);
      dev::wgmma_fence_operands(dx);
      keep_fragments(d);
      ld.o.release(q);
      if (j > 0) ld.ab.release(q - 1);
      if (j + 1 == ld.nch) dev::mbar_arrive(in_empty(base));
      __syncwarp();  // the previous chunk's staged rows are read
      swiglu_backward(d, acc, dh, stage, g, t);
      dev::wgmma_fence();
      input_grad(dx, d, w_ab, j == 0);
      dev::wgmma_commit();
      __syncwarp();
      store_hidden(a, stage, warp_row0, j, lane);
    }
    dev::wgmma_wait<0>();
    dev::wgmma_fence_operands(dx);
    keep_fragments(d);
    ld.ab.release(q - 1);
    store_dxhat(a, dx, row0, t);
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) backward_kernel(const BwdArgs a, const __grid_constant__ Maps m) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = align_1024(smem_raw);
  const uint32_t base = dev::smem_addr(smem);
  const int my_tiles = block_tiles(a.rows);
  const WeightLoads ld{&m.w_ab, &m.w_o, {base + Layout::ab, base + Layout::ab_bars, kAbStage, kAbStages},
                       {base + Layout::o, base + Layout::o_bars, kOStage, kOStages}, a.H, a.H / kChunk};
  run_roles(
      ld,
      [&] {
        dev::mbar_init(in_full(base), 1);
        dev::mbar_init(in_empty(base), kConsumers);
      },
      [&] { produce(m, base, ld, my_tiles); }, [&] { consume(smem, base, a, ld, my_tiles); });
}

}  // namespace

cudaError_t backward(const BwdArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  Maps m;
  constexpr auto kBf16 = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (!encode_rows(&m.xhat, a.xhat, kBf16, 2, a.rows, kC, 64, kRows, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_rows(&m.g, a.g, kBf16, 2, a.rows, kC, 64, kRows, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode_weights(&m.w_ab, &m.w_o, a.w_ab, a.w_o, a.H))
    return cudaErrorNotSupported;
  unsigned blocks = 0;
  cudaError_t e;
  if ((e = tpf::detail::persistent_grid(tile_count(a.rows), 1, &blocks)) != cudaSuccess) return e;
  if ((e = detail::allow_dynamic_smem(backward_kernel, Layout::bytes)) != cudaSuccess) return e;
  backward_kernel<<<blocks, kBlockThreads, Layout::bytes, stream>>>(a, m);
  return cudaGetLastError();
}

}  // namespace tpf::transition
