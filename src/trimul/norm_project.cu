// The inference forward's LayerNorm_in and input projection as one persistent kernel, where z's
// rows are contiguous, N % 8 == 0 and C = Ch = 128 (tile_config.h's NormProjectTile): z is read
// once and x̂ never leaves shared memory. A block is two consumer warpgroups of 64 pixel rows
// and a producer warpgroup (one thread: TMA). Per 128-row tile a consumer
//   normalizes its rows of the z stage in place (fp16 x̂, the layout wgmma reads),
//   then for each of the five column tiles [a/b x4 | output gate] issues x̂ Wcat_ntᵀ (m64n128k16)
//   into one of two accumulator sets and runs the previous column tile's epilogue
//   (ProjectTmaEpilogue: a, b channel-major, the gate pixel-major) under it.
// Elsewhere, and in training (the saving forward writes x̂ and its statistics for the
// backward), ln_rows_forward and project run as two kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/kernel_attrs.h"
#include "common/row_math.cuh"
#include "trimul/gemm_tma.cuh"
#include "trimul/norm_project.h"

namespace tpf::trimul {
namespace {

using Tile = NormProjectTile;
using Epi = ProjectTmaEpilogue<__half, Tile>;
constexpr int kRows = 64 * Tile::kConsumers;  // pixel rows a tile
constexpr int kColTiles = 5;                  // (4 Ch + C) / 128 at C = Ch = 128
constexpr uint32_t kHalf = kRows * 128;       // a [128 rows][64] 16-bit half in the 128-byte swizzle
constexpr uint32_t kStage = 2 * kHalf;        // [128 rows][128]: z rows or a weight column tile
constexpr int kThreads = 128 * (Tile::kConsumers + 1);
constexpr int kBarBoth = Tile::kConsumers + 1;  // named barrier of both consumers (1, 2: each one's)

// Shared memory from a 1024-byte aligned base.
struct Smem {
  static constexpr uint32_t kZ = 0;                   // [2 stages] z rows, normalized in place
  static constexpr uint32_t kW = 2 * kStage;          // [2 stages] Wcat column tiles [128 cols][128 C]
  static constexpr uint32_t kEpi = 4 * kStage;        // the epilogue's biases and buffers
  static constexpr uint32_t kBars = kEpi + (Epi::kSmemBytes + 7) / 8 * 8;  // z full/empty, w full/empty
  static constexpr uint32_t kBytes = kBars + 64 + 1024;
  uint32_t base;
  uint8_t* ptr;
  __device__ uint32_t z(int st) const { return base + kZ + st * kStage; }
  __device__ uint32_t w(int st) const { return base + kW + st * kStage; }
  __device__ uint32_t bar(int i) const { return base + kBars + 8 * i; }
  __device__ uint32_t z_full(int st) const { return bar(st); }
  __device__ uint32_t z_empty(int st) const { return bar(2 + st); }
  __device__ uint32_t w_full(int st) const { return bar(4 + st); }
  __device__ uint32_t w_empty(int st) const { return bar(6 + st); }
};
static_assert(Smem::kBytes <= 227 * 1024, "one block per SM");

struct Maps {
  CUtensorMap z;  // z [M][C] bf16, boxes of 64 channels x 128 rows
  CUtensorMap w;  // the folded weight [P][C] fp16, boxes of 64 channels x 128 rows
};

// The producer (one thread): each tile's z rows, then its five weight column tiles, each stage
// once both consumers released it.
__device__ void produce(const Maps& m, const Smem& s, int64_t tiles) {
  uint32_t it = 0, wu = 0;  // tiles and column tiles issued
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, ++it) {
    const int zs = it & 1, row = static_cast<int>(t * kRows);
    dev::mbar_wait(s.z_empty(zs), ((it >> 1) & 1) ^ 1);
    dev::mbar_arrive_expect_tx(s.z_full(zs), kStage);  // rows past M count, zero-filled
    for (int h = 0; h < 2; ++h) dev::tma_load_3d(s.z(zs) + h * kHalf, &m.z, s.z_full(zs), 64 * h, row, 0);
    for (int nt = 0; nt < kColTiles; ++nt, ++wu) {
      const int ws = wu & 1;
      dev::mbar_wait(s.w_empty(ws), ((wu >> 1) & 1) ^ 1);
      dev::mbar_arrive_expect_tx(s.w_full(ws), kStage);
      for (int h = 0; h < 2; ++h) dev::tma_load_3d(s.w(ws) + h * kHalf, &m.w, s.w_full(ws), 64 * h, 128 * nt, 0);
    }
  }
}

// LayerNorm_in (no affine: it is folded into Wcat) of consumer cw's 64 rows of a z stage, in
// place as fp16, with ln_rows_forward's arithmetic to the bit (its row groups of eight lanes,
// their 4-channel units, row_stats' order and shuffles): the saving forward, which takes the
// two kernels, must give the inference forward's output bit for bit. Sixteen rows a pass.
__device__ __forceinline__ void normalize(uint8_t* stage, int cw, float eps) {
  const int tid = threadIdx.x % 128, l8 = tid % rows::kGroupLanes;
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int r = 64 * cw + 16 * pass + tid / rows::kGroupLanes;  // the tile's row
    // the unit's 8 bytes: channel c in half c / 64, 16-byte chunk (c % 64) / 8 at its XOR with r % 8
    auto at = [&](int u) {
      const int c = rows::unit_channel(l8, u), cc = c % 64;
      return stage + (c / 64) * kHalf + r * 128 + (((cc / 8) ^ (r % 8)) << 4) + (cc % 8) * 2;
    };
    float v[16];  // [4u + e] channel unit_channel(l8, u) + e, as ln_rows_forward holds them
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint2 q = *reinterpret_cast<const uint2*>(at(u));
      const float2 lo = dev::pair_to_float2<__nv_bfloat16>(q.x), hi = dev::pair_to_float2<__nv_bfloat16>(q.y);
      v[4 * u] = lo.x, v[4 * u + 1] = lo.y, v[4 * u + 2] = hi.x, v[4 * u + 3] = hi.y;
    }
    const float2 st = rows::row_stats(v, 128, eps);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = (v[4 * u + e] - st.x) * st.y;
      *reinterpret_cast<uint2*>(at(u)) = make_uint2(dev::MmaOp<__half>::pack(y[0], y[1]), dev::MmaOp<__half>::pack(y[2], y[3]));
    }
  }
}

// x̂ Wcat_ntᵀ for consumer cw's 64 rows (m64n128k16 x 8: K = C = 128), both operands K-major in
// the 128-byte swizzle, issued as one committed batch into acc.
__device__ __forceinline__ void issue_product(float (&acc)[1][64], uint32_t xhat, uint32_t w, int cw) {
  auto desc = [](uint32_t tile, int kk) { return dev::wgmma_desc(tile + (kk / 4) * kHalf + 32 * (kk % 4), 16, 1024); };
  dev::wgmma_fence_operands(acc[0]);
  dev::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) dev::Wgmma<__half, 0, 0>::run(acc[0], desc(xhat + 64 * cw * 128, kk), desc(w, kk), kk > 0);
  dev::wgmma_commit();
  dev::wgmma_fence_operands(acc[0]);
}

// Consumer cw over the block's tiles.
__device__ void consume(const Epi& epi, const Smem& s, int cw, int64_t tiles, float eps) {
  uint8_t* esmem = s.ptr + Smem::kEpi;
  const bool leader = threadIdx.x % 128 == 0;
  epi.start(esmem, cw);
  dev::bar_sync(kBarBoth, 128 * Tile::kConsumers);  // the biases are staged
  float acc0[1][64], acc1[1][64];  // [part][wgmma accumulator]: the even and odd column tiles
  uint32_t it = 0, wu = 0, k = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, ++it, wu += kColTiles) {
    const int zs = it & 1;
    const int64_t m0 = t * kRows;
    dev::mbar_wait(s.z_full(zs), (it >> 1) & 1);
    normalize(s.ptr + Smem::kZ + zs * kStage, cw, eps);
    dev::fence_proxy_async();   // x̂'s stores, visible to wgmma
    dev::bar_sync(1 + cw, 128);  // the consumer's 64 rows are normalized
    auto product = [&](float(&acc)[1][64], int nt) {
      const uint32_t u = wu + nt;
      dev::mbar_wait(s.w_full(u & 1), (u >> 1) & 1);
      issue_product(acc, s.z(zs), s.w(u & 1), cw);
    };
    auto release = [&](int nt) {  // column tile nt's product is done: its weight stage is free
      if (leader) dev::mbar_arrive(s.w_empty((wu + nt) & 1));
    };
    product(acc0, 0);
#pragma unroll
    for (int nt = 0; nt < kColTiles; ++nt) {
      const bool even = nt % 2 == 0;
      if (nt + 1 < kColTiles) {
        product(even ? acc1 : acc0, nt + 1);
        dev::wgmma_wait<1>();
      } else {
        dev::wgmma_wait<0>();
        if (leader) dev::mbar_arrive(s.z_empty(zs));  // every product of the tile has read x̂
      }
      release(nt);
      float(&acc)[1][64] = even ? acc0 : acc1;
      dev::wgmma_fence_operands(acc[0]);
      epi.tile(esmem, acc, cw, m0, 128 * nt, 0, static_cast<int>(k++));
    }
  }
  epi.finish(cw);
}

__global__ void __launch_bounds__(kThreads, 1)
    norm_project_kernel(const __grid_constant__ Maps maps, const __grid_constant__ Epi epi, float eps, int64_t tiles) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem s;
  s.ptr = smem_raw + ((1024 - (dev::smem_addr(smem_raw) & 1023)) & 1023);
  s.base = dev::smem_addr(s.ptr);
  if (threadIdx.x == 0) {
    for (int st = 0; st < 2; ++st) {
      dev::mbar_init(s.z_full(st), 1);
      dev::mbar_init(s.z_empty(st), Tile::kConsumers);
      dev::mbar_init(s.w_full(st), 1);
      dev::mbar_init(s.w_empty(st), Tile::kConsumers);
    }
    dev::mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == Tile::kConsumers) {
    dev::regs_decrease<Tile::kProducerRegs>();
    if (threadIdx.x == 128 * Tile::kConsumers) produce(maps, s, tiles);
    return;
  }
  dev::regs_increase<Tile::kConsumerRegs>();
  consume(epi, s, wg, tiles, eps);
}

// Whether z's rows are one contiguous [M][C] matrix (channel stride 1).
bool contiguous_rows(const PairRef& z, const Dims& d) {
  return z.sj == d.C && z.si == d.N * d.C && (d.B == 1 || z.sb == d.N * d.N * d.C);
}

}  // namespace

cudaError_t norm_project(const Problem& p, const Workspace& ws, cudaStream_t s, bool* done) {
  *done = false;
  const Dims& d = p.d;
  const bool inference = !ws.xhat_in_bf && !ws.mean_in && !ws.logit && !ws.a_bf;
  if (!inference || d.C != 128 || d.Ch != 128 || d.N % 8 != 0 || !contiguous_rows(p.z, d)) return cudaSuccess;
  Maps maps{};
  if (!encode_tma_matrices(&maps.z, p.z.ptr, d.C, 0, d.M(), d.C, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kRows, 1) ||
      !encode_tma_matrices(&maps.w, ws.wcat, d.C, 0, d.proj_cols(), d.C, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, 128, 1))
    return cudaSuccess;
  const Epi epi{ProjectOutputs<__half>{d, ws.bcat, p.mask, static_cast<__half*>(ws.a), static_cast<__half*>(ws.b),
                                       nullptr, nullptr, static_cast<__half*>(ws.gate), nullptr}};
  const int64_t tiles = (d.M() + kRows - 1) / kRows;
  unsigned grid = 0;
  cudaError_t e = tpf::detail::allow_dynamic_smem(norm_project_kernel, static_cast<int>(Smem::kBytes));
  if (e != cudaSuccess || (e = tpf::detail::persistent_grid(tiles, 1, &grid)) != cudaSuccess) return e;
  norm_project_kernel<<<grid, kThreads, Smem::kBytes, s>>>(maps, epi, p.eps, tiles);
  *done = true;
  return cudaGetLastError();
}

}  // namespace tpf::trimul
