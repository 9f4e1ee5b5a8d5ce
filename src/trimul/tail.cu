// The fused backward tail (tail_parts.cuh): the input projection's backward, d x̂_in and
// LayerNorm_in's backward in one persistent kernel, for C = 128, Ch <= 128 (a multiple of 32)
// and N % 8 == 0; backward.cu takes the three-kernel path elsewhere.
#include <cuda_bf16.h>

#include "common/kernel_attrs.h"
#include "trimul/gemm_tma.cuh"
#include "trimul/tail.h"
#include "trimul/tail_parts.cuh"

namespace tpf::trimul {
namespace tail {
namespace {

constexpr int kBarConsumers = 3;                         // named barrier of both consumers (1, 2: each one's)

// The tile's per-warp totals (column sums of dlin's a/b columns, d gamma and d beta), summed
// over the eight warps in order by both consumers together into the tile's partials. Each
// consumer stages its four warps' totals in its own high-part tile (free once its d x̂ is done):
// [4 warps][4Ch], then [4][2C].
__device__ __forceinline__ float* staged_totals(const TailSmem& s, int c) {
  return reinterpret_cast<float*>(s.ptr + TailSmem::kHi + c * TailSmem::kWgTile);
}
// The column sums first (before LayerNorm_in's backward, whose registers they would crowd).
__device__ __forceinline__ void stage_column_sums(const TailArgs& a, const TailSmem& s, int c,
                                                  const float (&cs)[kMaxTiles][4]) {
  const int w = (threadIdx.x / 32) % 4, t = threadIdx.x & 3, ab = 128 * a.col_tiles, b32 = scatter_base<32>();
  float* sums = staged_totals(s, c);
#pragma unroll
  for (int slot = 0; slot < kMaxTiles; ++slot) {
    const int nt = slot - (kMaxTiles - a.col_tiles);  // cs's slots end with the last column tile
    if (nt >= 0)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sums[w * ab + 128 * nt + sums_column(b32 + j, t)] = cs[slot][j];
      }
  }
}
__device__ __forceinline__ void tile_totals(const TailArgs& a, const TailSmem& s, int c, int64_t m0,
                                            const float (&pgb)[64]) {
  const int w = (threadIdx.x / 32) % 4, t = threadIdx.x & 3, ab = 128 * a.col_tiles, b64 = scatter_base<64>();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int q = b64 + j;  // pgb index: [d gamma | d beta][2i + e]
    staged_totals(s, c)[4 * ab + w * 256 + 128 * (q / 32) + norm_channel(q % 32, t)] = pgb[j];
  }
  dev::bar_sync(kBarConsumers, 256);
  const int tid = threadIdx.x - 128, tile = static_cast<int>(m0 / kRows);
  float tot = 0.f;
  for (int k = 0; k < 8; ++k) tot += staged_totals(s, k / 4)[4 * ab + (k % 4) * 256 + tid];
  a.norm_part[int64_t{tile} * 256 + tid] = tot;
  for (int col = tid; col < ab; col += 256) {
    float v = 0.f;
    for (int k = 0; k < 8; ++k) v += staged_totals(s, k / 4)[(k % 4) * ab + col];
    a.colsum_lin[int64_t{tile} * a.d.proj_cols() + col] = v;
  }
  dev::bar_sync(kBarConsumers, 256);  // the staged totals are read: the tiles are free again
}

// 64 rows of a [rows][128] 16-bit map from `row` into a consumer's K-major tile (two 64-column
// halves), completing on `bar` (one thread).
__device__ __forceinline__ void load_rows(const CUtensorMap* map, uint32_t dst, uint32_t bar, int64_t row) {
  dev::mbar_arrive_expect_tx(bar, TailSmem::kWgTile);
  for (int h = 0; h < 2; ++h) dev::tma_load_3d(dst + h * TailSmem::kWgTile / 2, map, bar, 64 * h, static_cast<int>(row), 0);
}

// Column tile nt's high and low parts from the consumer's A tiles to dlin's rows from mw (rows
// past r1 clipped by the map), for dW_in (one thread; a bulk group the next writer waits for).
__device__ __forceinline__ void store_dlin(const TailMaps& maps, const TailArgs& a, const TailSmem& s, int c, int nt,
                                           int64_t mw) {
  for (int h = 0; h < 2; ++h) {
    const int row = static_cast<int>(mw - a.r0), col = 128 * nt + 64 * h;
    dev::tma_store_3d(&maps.dlin, s.hi(c) + h * TailSmem::kWgTile / 2, col, row, 0);
    dev::tma_store_3d(&maps.dlin, s.lo(c) + h * TailSmem::kWgTile / 2, static_cast<int>(a.d.proj_cols()) + col, row, 0);
  }
  dev::bulk_commit();
}

// One consumer warpgroup (c: rows 64c .. 64c + 63 of each tile) over the block's tiles.
template <class Tdz>
__device__ __forceinline__ void consume(const TailMaps& maps, const TailArgs& a, const TailSmem& s, int c, int64_t tiles) {
  const bool leader = threadIdx.x % 128 == 0;
  const int NT = a.col_tiles;
  uint32_t uses_c = 0, uses_r = 0, uses_x = 0, uses_g = 0;
  int64_t t = blockIdx.x;
  auto xhat_row = [&](int64_t tile) { return a.r0 + kRows * tile + 64 * c - a.xhat_row0; };  // the map's row
  if (t < tiles) {
    if (leader) load_rows(&maps.xhat, s.xhat(c), s.xhat_full(c), xhat_row(t));
    load_da(a, s.da(0, c), 0, a.r0 + kRows * t + 64 * c);
  }
  dev::cp_async_commit();
  for (; t < tiles; t += gridDim.x) {
    const int64_t m0 = a.r0 + kRows * t, mw = m0 + 64 * c, next = t + gridDim.x;
    float mk[2];  // the mask at the thread's rows (0 past r1)
    for (int h = 0; h < 2; ++h) {
      const int64_t m = mw + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x & 31) / 4 + 8 * h;
      mk[h] = m < a.r1 ? mask_at(a.mask, m, a.d.N) : 0.f;
    }
    float dx[64];               // d x̂ of the consumer's rows [64 px][128 C]
    float cs[kMaxTiles][4] = {};  // the column tiles' scattered column totals, the last tile's last
    dev::mbar_wait(s.xhat_full(c), uses_x++ & 1);
    for (int nt = 0; nt < NT; ++nt) {
      if (nt + 1 < NT) {
        load_da(a, s.da((nt + 1) & 1, c), nt + 1, mw);
      } else if (leader) {  // the gate columns' gradient takes the free da buffer
        dev::fence_proxy_async();
        load_rows(&maps.dgate, s.da(NT & 1, c), s.dgate_full(c), mw - a.dgate_row0);
      }
      dev::cp_async_commit();
      float pg[64];  // [p | g] logits [64 px][128 cols]
      dev::mbar_wait(s.wcat_full(), uses_c++ & 1);
      recompute(pg, s, c, a.bcat + 128 * nt);
      if (leader) dev::mbar_arrive(s.wcat_empty());
      dev::cp_async_wait<1>();
      if (leader) dev::bulk_wait_read<0>();  // the previous column tile's dlin store has read its tiles
      dev::bar_sync(1 + c, 128);  // da landed for every thread; x̂'s last reader done
      if (nt + 1 == NT && next < tiles && leader) load_rows(&maps.xhat, s.xhat(c), s.xhat_full(c), xhat_row(next));
      float sums[32] = {};
      dlin_epilogue(pg, s, c, s.da(nt & 1, c), mk, sums);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // shift in: after the loop cs[kMaxTiles - NT + nt] is tile nt's
#pragma unroll
        for (int q = 0; q + 1 < kMaxTiles; ++q) cs[q][j] = cs[q + 1][j];
        cs[kMaxTiles - 1][j] = sums[j];
      }
      dev::fence_proxy_async();
      dev::bar_sync(1 + c, 128);  // the consumer's dlin tiles are written
      if (leader) store_dlin(maps, a, s, c, nt, mw);
      dev::mbar_wait(s.wraw_full(), uses_r++ & 1);
      accumulate_dxhat(dx, s, s.hi(c), s.lo(c), true, nt == 0);
      if (leader) dev::mbar_arrive(s.wraw_empty());
      dev::bar_sync(1 + c, 128);  // dlin read: the next column tile may overwrite it
    }
    NormRows nr;  // LayerNorm_in's inputs, in flight during the gate columns' product
    load_norm_rows<Tdz>(a, mw, nr);
    dev::mbar_wait(s.dgate_full(c), uses_g++ & 1);
    dev::mbar_wait(s.wraw_full(), uses_r++ & 1);
    accumulate_dxhat(dx, s, s.da(NT & 1, c), 0, false, false);
    if (leader) dev::mbar_arrive(s.wraw_empty());
    if (leader) dev::bulk_wait_read<0>();  // the dlin tiles may take the tile's totals
    dev::bar_sync(1 + c, 128);  // dgate read: its buffer may take the next tile's da
    if (next < tiles) load_da(a, s.da(0, c), 0, a.r0 + kRows * next + 64 * c);
    dev::cp_async_commit();
    stage_column_sums(a, s, c, cs);
    float pgb[64];
    norm_backward<Tdz>(a, dx, s.gamma(), mw, nr, pgb);
    tile_totals(a, s, c, m0, pgb);
  }
  dev::cp_async_wait<0>();
  if (leader) dev::bulk_wait_all();  // the shared memory stays until the last stores read it
}

template <class Tdz>
__global__ void __launch_bounds__(kThreads, 1) tail_kernel(const __grid_constant__ TailMaps maps,
                                                           const __grid_constant__ TailArgs a) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  TailSmem s;
  s.ptr = smem_raw + ((1024 - (dev::smem_addr(smem_raw) & 1023)) & 1023);
  s.base = dev::smem_addr(s.ptr);
  const int64_t tiles = (a.r1 - a.r0 + kRows - 1) / kRows;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 8; ++i) dev::mbar_init(s.bar(i), i == 1 || i == 3 ? 2 : 1);  // empties: both consumers
    dev::mbar_init_fence();
  }
  if (threadIdx.x < 128) reinterpret_cast<float*>(s.ptr + TailSmem::kGamma)[threadIdx.x] = weight_at(a.gamma, 0, threadIdx.x);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    dev::regs_decrease<TailTile::kProducerRegs>();
    if (threadIdx.x == 0) produce_weights(maps, s, tiles, a.col_tiles);
    return;
  }
  dev::regs_increase<TailTile::kConsumerRegs>();
  consume<Tdz>(maps, a, s, wg - 1, tiles);
}

// A [rows][cols] 16-bit matrix (row stride ld) as a TMA map with boxes of 64 columns x box_rows.
bool matrix_map(CUtensorMap* map, const void* ptr, int64_t ld, int64_t rows, int64_t cols, bool fp16, int box_rows) {
  return encode_tma_matrices(map, ptr, ld, 0, rows, cols,
                             fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, box_rows, 1);
}

template <class Tdz>
cudaError_t launch(const TailMaps& maps, const TailArgs& a, cudaStream_t stream) {
  auto* kernel = tail_kernel<Tdz>;
  const int64_t tiles = (a.r1 - a.r0 + kRows - 1) / kRows;
  unsigned grid = 0;
  cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, TailSmem::kBytes);
  if (e != cudaSuccess || (e = tpf::detail::persistent_grid(tiles, 1, &grid)) != cudaSuccess) return e;
  kernel<<<grid, kThreads, TailSmem::kBytes, stream>>>(maps, a);
  return cudaGetLastError();
}

}  // namespace
}  // namespace tail

cudaError_t fused_tail(const Problem& p, const Workspace& ws, int64_t r0, int64_t r1, cudaStream_t s) {
  const Dims& d = p.d;
  const int64_t P = d.proj_cols(), PL = d.dlin_cols();
  if (!fused_tail_ok(d)) return cudaErrorNotSupported;
  if (r1 <= r0) return cudaSuccess;
  auto* dlin = static_cast<__nv_bfloat16*>(ws.dlin);
  // dgate: its own [M][C] buffer when dlin holds a chunk, else dlin's gate columns
  const void* dgate = ws.dgate ? ws.dgate : static_cast<const void*>(dlin + 4 * d.Ch);
  const int64_t dg_ld = ws.dgate ? d.C : PL, dg_rows = ws.dgate ? d.M() : r1 - r0, dg_row0 = ws.dgate ? 0 : r0;
  tail::TailMaps maps{};
  if (!tail::matrix_map(&maps.xhat, ws.xhat_in, d.C, r1 - ws.xhat_row0, d.C, true, 64) ||
      !tail::matrix_map(&maps.wcat, ws.wcat, d.C, P, d.C, true, 128) ||
      !tail::matrix_map(&maps.wraw, ws.wcat_raw, d.C, PL, d.C, false, 64) ||
      !tail::matrix_map(&maps.dgate, dgate, dg_ld, dg_rows, d.C, false, 64) ||
      !tail::matrix_map(&maps.dlin, dlin, PL, r1 - r0, PL, false, 64))
    return cudaErrorNotSupported;
  tail::TailArgs a{};
  a.d = d, a.bcat = ws.bcat, a.mask = p.mask, a.da = ws.da, a.db = ws.db;
  a.colsum_lin = ws.colsum_lin, a.gamma = p.w.w[kNormInW], a.mean = ws.mean_in, a.rstd = ws.rstd_in;
  a.z = p.z, a.dz = p.dz, a.dz_in = p.dz_in, a.norm_part = ws.norm_in_part;
  a.r0 = r0, a.r1 = r1, a.dgate_row0 = dg_row0, a.xhat_row0 = ws.xhat_row0, a.col_tiles = static_cast<int>(4 * d.Ch / 128);
  return p.dz_f32 ? tail::launch<float>(maps, a, s) : tail::launch<__nv_bfloat16>(maps, a, s);
}

}  // namespace tpf::trimul
