// The GEMM engine's persistent main loop on Hopper's native path, for the triangle products (K =
// N, batched over channels: the op's cubic work) and the input projection. One
// block per SM walks the output tiles; its producer warp copies each k-step's operand tiles with
// TMA into a ring of stages, and its consumer warpgroups (64 rows each) run m64n128k16 wgmma
// straight from the stages, keeping one k-step's batch in flight while they release the stage
// before it. Each consumer warpgroup then hands its accumulators to the epilogue and goes on
// to its next tile; the producer runs ahead into that tile meanwhile, so the epilogue overlaps
// the next tile's loads (and, where it stores through TMA, its own stores overlap the next
// tile's MMAs). Tiles, swizzle and descriptors are the wgmma engine's (gemm_wgmma.cuh).
//
// Stage layout (128-byte swizzle, 1024-byte aligned, as TMA's SWIZZLE_128B writes it):
//   K-major  [rows][64 k]: one box of kBlockM (A) or kBlockN (B) rows of 128 bytes.
//   MN-major [64 k][rows]: boxes of [64 k][64 mn], 8 KB apart (the descriptors' LBO).
//
// An epilogue Epi defines kBlockN, kStages, kConsumers, kProducerRegs and kConsumerRegs (its
// tile table row, tile_config.h; tiles are 64 kConsumers rows), kSplitK (the batches are split-K
// chunks of one product's K rather than matrices: chunk z of the shape's k_chunk rows, the
// epilogue told its chunk), kSmemBytes (its shared memory after the stages,
// 1024-byte aligned), and
//   start(smem, cw)                                 once per consumer warpgroup, before its first tile
//   tile(smem, acc, cw, m0, n0, z, k)               the warpgroup's rows of its k-th tile
//   finish(cw)                                      after its last tile
// with acc[kBlockN / 128][64] in the wgmma accumulator layout (common/wgmma.cuh); named
// barriers 1 + cw are the warpgroups' own, kConsumers + 1 spans them all.
#pragma once
#include <cuda.h>

#include <type_traits>

#include "common/tma.cuh"
#include "common/tma.h"
#include "common/warp_roles.cuh"
#include "trimul/epilogues.cuh"
#include "trimul/gemm_wgmma.cuh"

namespace tpf::trimul {

using TCfg = TmaLoopConfig;

template <class Epi>
constexpr int kTmaBlockM = 64 * Epi::kConsumers;
template <class Epi>
constexpr int kTmaThreads = 128 * (Epi::kConsumers + 1);  // + the producer's warpgroup

struct TmaOperands {
  CUtensorMap a, b;  // 3-D: (columns, rows, batch) of each operand as stored
};

// A matrix batch as a 3-D map (columns, rows, batch) with the 128-byte swizzle and boxes of
// 128 bytes x box_rows; false where TMA cannot reach it.
inline bool encode_tma_matrices(CUtensorMap* map, const void* ptr, int64_t ld, int64_t batch_stride, int64_t rows,
                                int64_t cols, CUtensorMapDataType type, int elem_bytes, int box_rows, int batches) {
  tpf::detail::TmaTile t;
  t.rank = 3;
  t.dims[0] = static_cast<uint64_t>(cols);
  t.dims[1] = static_cast<uint64_t>(rows);
  t.dims[2] = static_cast<uint64_t>(batches);
  t.strides[0] = static_cast<uint64_t>(ld) * elem_bytes;
  // A dimension of size 1 is never stepped: any valid stride will do for it.
  t.strides[1] = batches == 1 ? t.strides[0] : static_cast<uint64_t>(batch_stride) * elem_bytes;
  t.box[0] = static_cast<uint32_t>(128 / elem_bytes);
  t.box[1] = static_cast<uint32_t>(box_rows);
  t.box[2] = 1;
  return tpf::detail::encode_tma(map, ptr, type, t, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The operands' maps for tiles of block_m x block_n (K-major boxes: 64 columns x the tile's rows;
// MN-major: 64 x 64); false where TMA cannot reach one (a row offset among them).
template <class T, Major AM, Major BMJ>
bool encode_tma_operands(TmaOperands* maps, const Operand& A, const Operand& B, int block_m, int block_n,
                         int batches) {
  constexpr CUtensorMapDataType kType =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return A.row0 == 0 && B.row0 == 0 &&
         encode_tma_matrices(&maps->a, A.ptr, A.ld, A.batch_stride, A.rows, A.cols, kType, 2,
                             AM == Major::kMN ? 64 : block_m, batches) &&
         encode_tma_matrices(&maps->b, B.ptr, B.ld, B.batch_stride, B.rows, B.cols, kType, 2,
                             BMJ == Major::kMN ? 64 : block_n, batches);
}

namespace detail {

// The block's output tiles in order: n fastest, then m, then the batch (tiles of one matrix
// share its operands in L2).
template <int kBM, int kBN>
struct TmaTiles {
  int m_tiles, n_tiles;
  int64_t total;
  int nk;  // k-steps a tile
  __device__ TmaTiles(const GemmShape& s, int batches)
      : m_tiles(static_cast<int>((s.M + kBM - 1) / kBM)),
        n_tiles((s.N + kBN - 1) / kBN),
        total(int64_t{m_tiles} * n_tiles * batches),
        nk(static_cast<int>((s.K + TCfg::kBlockK - 1) / TCfg::kBlockK)) {}
  __device__ void at(int64_t t, int64_t& m0, int& n0, int& z) const {
    const int64_t per_batch = int64_t{m_tiles} * n_tiles;
    z = static_cast<int>(t / per_batch);
    const int64_t r = t % per_batch;
    m0 = (r / n_tiles) * kBM;
    n0 = static_cast<int>(r % n_tiles) * kBN;
  }
  static constexpr bool kSplit = false;  // batch z: matrix z, from K row 0
};

// Split-K (Epi::kSplitK): a batch is chunk z of one product's K, whose rows start at z k_chunk
// of the one matrix the maps hold (rows past K read as zero); the epilogue is told the chunk.
template <int kBM, int kBN>
struct TmaSplitTiles : TmaTiles<kBM, kBN> {
  int64_t k_chunk;
  __device__ TmaSplitTiles(const GemmShape& s, int batches)
      : TmaTiles<kBM, kBN>(s, batches), k_chunk(s.k_chunk) {
    this->nk = static_cast<int>((s.k_chunk + TCfg::kBlockK - 1) / TCfg::kBlockK);
  }
  static constexpr bool kSplit = true;
  __device__ int64_t k_first(int z) const { return z * k_chunk; }  // the chunk's first K row
};
template <class Epi>
using TilesOf = std::conditional_t<Epi::kSplitK, TmaSplitTiles<kTmaBlockM<Epi>, Epi::kBlockN>,
                                   TmaTiles<kTmaBlockM<Epi>, Epi::kBlockN>>;

// The ring of stages and its two barriers per stage: full (the producer's copies landed) and
// empty (every consumer warp's wgmma that read it completed).
template <int kBM, int kBN, int kStages>
struct TmaRing {
  static constexpr uint32_t kABytes = kBM * TCfg::kBlockK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBN * TCfg::kBlockK * 2;
  uint32_t base;  // shared address of stage 0 (1024-byte aligned)
  uint32_t bars;  // full[kStages], then empty[kStages], 8 bytes each
  __device__ uint32_t a(int st) const { return base + st * kStageBytes; }
  __device__ uint32_t b(int st) const { return a(st) + kABytes; }
  __device__ uint32_t full(int st) const { return bars + 8 * st; }
  __device__ uint32_t empty(int st) const { return bars + 8 * (kStages + st); }
};

// One k-step's copies into a stage: `rows` rows of an operand from (row0, k0) of matrix z.
template <Major MAJ>
__device__ __forceinline__ void copy_operand(uint32_t dst, const CUtensorMap* map, uint32_t bar, int rows, int64_t row0,
                                             int64_t k0, int z) {
  if constexpr (MAJ == Major::kK) {
    dev::tma_load_3d(dst, map, bar, static_cast<int>(k0), static_cast<int>(row0), z);
  } else {
#pragma unroll
    for (int h = 0; h < rows / 64; ++h)
      dev::tma_load_3d(dst + h * kHalfBytes, map, bar, static_cast<int>(row0 + 64 * h), static_cast<int>(k0), z);
  }
}

// The producer (one thread): every tile's k-steps, in the consumers' order, each into the next
// stage of the ring once the consumers have released it.
template <Major AM, Major BMJ, int kBM, int kBN, int kStages, class Tiles>
__device__ void produce(const TmaOperands& maps, const TmaRing<kBM, kBN, kStages>& ring, const Tiles& tiles) {
  int it = 0;  // k-steps issued so far: stage it % kStages, pass it / kStages
  for (int64_t t = blockIdx.x; t < tiles.total; t += gridDim.x) {
    int64_t m0;
    int n0, z;
    tiles.at(t, m0, n0, z);
    for (int kt = 0; kt < tiles.nk; ++kt, ++it) {
      const int st = it % kStages;
      dev::mbar_wait(ring.empty(st), ((it / kStages) & 1) ^ 1);  // a fresh barrier's "previous" phase
      dev::mbar_arrive_expect_tx(ring.full(st), ring.kStageBytes);  // boxes past the extents count, zero-filled
      const int64_t k0 = int64_t{kt} * TCfg::kBlockK;
      if constexpr (Tiles::kSplit) {
        copy_operand<AM>(ring.a(st), &maps.a, ring.full(st), kBM, m0, tiles.k_first(z) + k0, 0);
        copy_operand<BMJ>(ring.b(st), &maps.b, ring.full(st), kBN, n0, tiles.k_first(z) + k0, 0);
      } else {
        copy_operand<AM>(ring.a(st), &maps.a, ring.full(st), kBM, m0, k0, z);
        copy_operand<BMJ>(ring.b(st), &maps.b, ring.full(st), kBN, n0, k0, z);
      }
    }
  }
}

// Consumer warpgroup cw (rows 64 cw of each tile): per tile, the k-steps' wgmma into acc (its
// 128-column parts), then the epilogue.
template <class T, Major AM, Major BMJ, class Epi>
__device__ void consume(const TmaRing<kTmaBlockM<Epi>, Epi::kBlockN, Epi::kStages>& ring, const TilesOf<Epi>& tiles,
                        const Epi& epi, uint8_t* esmem, int cw) {
  constexpr int kParts = Epi::kBlockN / 128;
  const int lane = threadIdx.x & 31;
  int it = 0, k = 0;
  epi.start(esmem, cw);
  dev::bar_sync(Epi::kConsumers + 1, 128 * Epi::kConsumers);
  for (int64_t t = blockIdx.x; t < tiles.total; t += gridDim.x, ++k) {
    int64_t m0;
    int n0, z;
    tiles.at(t, m0, n0, z);
    float acc[kParts][64];  // [128-column part][4 n8 + c]: the wgmma accumulator layout
    int prev = -1;          // the stage of the k-step still in flight
    for (int kt = 0; kt < tiles.nk; ++kt, ++it) {
      const int st = it % Epi::kStages;
      dev::mbar_wait(ring.full(st), (it / Epi::kStages) & 1);
      dev::wgmma_fence();
#pragma unroll
      for (int j = 0; j < TCfg::kBlockK / 16; ++j)
#pragma unroll
        for (int h = 0; h < kParts; ++h)
          dev::Wgmma<T, AM == Major::kMN, BMJ == Major::kMN>::run(
              acc[h], operand_desc<AM>(ring.a(st), 64 * cw, j), operand_desc<BMJ>(ring.b(st), 128 * h, j),
              kt > 0 || j > 0);
      dev::wgmma_commit();
      dev::wgmma_wait<1>();  // the previous k-step's batch is done: its stage is free
      if (prev >= 0 && lane == 0) dev::mbar_arrive(ring.empty(prev));
      prev = st;
    }
    dev::wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < kParts; ++h) dev::wgmma_fence_operands(acc[h]);
    if (prev >= 0 && lane == 0) dev::mbar_arrive(ring.empty(prev));
    epi.tile(esmem, acc, cw, m0, n0, z, k);  // z: the matrix, or the split-K chunk
  }
  epi.finish(cw);
}

}  // namespace detail

template <class Epi>
constexpr int tma_loop_smem_bytes() {
  return Epi::kStages * detail::TmaRing<kTmaBlockM<Epi>, Epi::kBlockN, Epi::kStages>::kStageBytes + Epi::kSmemBytes +
         1024 +
         16 * Epi::kStages;
}

template <class T, Major AM, Major BMJ, class Epi>
__global__ void __launch_bounds__(kTmaThreads<Epi>, 1)
    gemm_tma_kernel(const __grid_constant__ TmaOperands maps, const GemmShape s, const int batches,
                    const __grid_constant__ Epi epi) {
  static_assert(Epi::kBlockN % 128 == 0 && TCfg::kBlockK == 64 && Epi::kConsumers + 1 <= 15,
                "m64n128k16 per 128 columns and k16 step; named barriers 1 .. kConsumers + 1");
  static_assert(tma_loop_smem_bytes<Epi>() <= 227 * 1024, "one block per SM");
  // setmaxnreg moves registers within what the launch allocated (registers a thread, a multiple of
  // 8, times the threads): an increase past that pool never returns.
  static_assert(Epi::kProducerRegs * 128 + Epi::kConsumerRegs * 128 * Epi::kConsumers <=
                    (65536 / kTmaThreads<Epi>) / 8 * 8 * kTmaThreads<Epi>,
                "setmaxnreg: within the launch's register pool");
  using Ring = detail::TmaRing<kTmaBlockM<Epi>, Epi::kBlockN, Epi::kStages>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t raw = dev::smem_addr(smem_raw), pad = (1024 - (raw & 1023)) & 1023, base = raw + pad;
  uint8_t* esmem = smem_raw + pad + Epi::kStages * Ring::kStageBytes;  // the epilogue's, 1024-byte aligned
  const Ring ring{base, base + Epi::kStages * Ring::kStageBytes + Epi::kSmemBytes};
  const detail::TilesOf<Epi> tiles(s, batches);
  if (threadIdx.x == 0) {
    for (int st = 0; st < Epi::kStages; ++st) {
      dev::mbar_init(ring.full(st), 1);
      dev::mbar_init(ring.empty(st), 4 * Epi::kConsumers);  // one arrival per consumer warp
    }
    dev::mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == Epi::kConsumers) {
    dev::regs_decrease<Epi::kProducerRegs>();
    if (threadIdx.x == 128 * Epi::kConsumers) detail::produce<AM, BMJ>(maps, ring, tiles);
  } else {
    dev::regs_increase<Epi::kConsumerRegs>();
    detail::consume<T, AM, BMJ>(ring, tiles, epi, esmem, wg);
  }
}

// Launches the loop over `batches` matrices (no split-K, rows from 0): one block per SM, at
// most one per tile.
template <class T, Major AM, Major BMJ, class Epi>
cudaError_t launch_tma_loop(const TmaOperands& maps, const GemmShape& s, int batches, const Epi& epi,
                            cudaStream_t stream) {
  auto* kernel = gemm_tma_kernel<T, AM, BMJ, Epi>;
  constexpr int kSmem = tma_loop_smem_bytes<Epi>();
  constexpr int kBM = kTmaBlockM<Epi>;
  const int64_t tiles = ((s.M + kBM - 1) / kBM) * ((s.N + Epi::kBlockN - 1) / Epi::kBlockN) * int64_t{batches};
  if (tiles == 0) return cudaSuccess;
  unsigned grid = 0;
  cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, kSmem);
  if (e != cudaSuccess || (e = tpf::detail::persistent_grid(tiles, 1, &grid)) != cudaSuccess) return e;
  kernel<<<grid, kTmaThreads<Epi>, kSmem, stream>>>(maps, s, batches, epi);
  return cudaGetLastError();
}

// The triangle products' and the weight gradients' epilogue (Tile: their row of tile_config.h):
// each consumer warpgroup writes its 64 rows box by box (128 bytes of columns) into two shared
// slots in the 128-byte swizzle, in turn, and one thread hands each to a TMA store; a slot is
// rewritten once its previous copy has read it. (Stores straight from registers, 4-byte pieces
// of eight rows an instruction, took 40% of the product's time.)
template <class OutT, class Tile = ProductTile>
struct TmaStoreEpilogue {
  static constexpr int kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  static constexpr int kConsumers = Tile::kConsumers, kProducerRegs = Tile::kProducerRegs,
                       kConsumerRegs = Tile::kConsumerRegs;
  static constexpr bool kSplitK = Tile::kSplitK;
  static constexpr int kSlotBytes = 64 * 128;  // one box: 64 rows of 128 bytes
  static constexpr int kSmemBytes = 2 * kConsumers * kSlotBytes;
  static constexpr int kCols = 128 / sizeof(OutT);  // a box's columns: 64 16-bit or 32 fp32
  static constexpr int kBoxes = kBlockN / kCols;    // a tile's
  CUtensorMap out;                                  // C: (columns, rows, batch), boxes of 128 bytes x 64 rows

  __device__ void start(uint8_t*, int) const {}
  __device__ void tile(uint8_t* smem, const float (&acc)[kBlockN / 128][64], int cw, int64_t m0, int n0, int z,
                       int k) const {
    const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
    const bool leader = threadIdx.x % 128 == 0;
    const uint32_t slots = dev::smem_addr(smem) + 2 * cw * kSlotBytes;
#pragma unroll
    for (int part = 0; part < kBlockN / 128; ++part)
#pragma unroll
      for (int b = 0; b < 128 / kCols; ++b) {  // boxes of this 128-column part
        const int box = k * kBoxes + part * (128 / kCols) + b;
        const uint32_t slot = slots + (box & 1) * kSlotBytes;
        if (leader && box >= 2) dev::bulk_wait_read<1>();  // the copy of box - 2 has left this slot
        dev::bar_sync(1 + cw, 128);
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j)  // the box's n8 tiles: columns 8j + 2t, + 1 of the box
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int i = b * (kCols / 8) + j;  // n8 tile of the part
            const float v0 = acc[part][4 * i + 2 * h], v1 = acc[part][4 * i + 2 * h + 1];
            const int row = 16 * w + g + 8 * h, byte = (8 * j + 2 * t) * static_cast<int>(sizeof(OutT));
            const uint32_t at = slot + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);  // 128-byte swizzle
            if constexpr (sizeof(OutT) == 4) {
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(v0), "f"(v1) : "memory");
            } else {
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(dev::MmaOp<OutT>::pack(v0, v1)) : "memory");
            }
          }
        dev::fence_proxy_async();  // this thread's writes, visible to the copy
        dev::bar_sync(1 + cw, 128);
        if (leader) {
          dev::tma_store_3d(&out, slot, n0 + 128 * part + b * kCols, static_cast<int>(m0 + 64 * cw), z);
          dev::bulk_commit();
        }
      }
  }
  __device__ void finish(int) const {
    if (threadIdx.x % 128 == 0) dev::bulk_wait_all();  // the slots stay allocated until the copies read them
  }
};

// The weight gradients' wide tiles' epilogue: each thread stores its fp32 partials straight from
// registers (StoreEpilogue's fragments: a quad writes 32 contiguous bytes of a row). With K chunks
// of ~180 k-steps it runs once per ~180, so it needs no store slots, and their shared memory
// holds one more stage of the ring instead (tile_config.h's WgradWideTile).
template <class Tile>
struct RegisterStoreEpilogue {
  static constexpr int kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  static constexpr int kConsumers = Tile::kConsumers, kProducerRegs = Tile::kProducerRegs,
                       kConsumerRegs = Tile::kConsumerRegs;
  static constexpr bool kSplitK = Tile::kSplitK;
  static constexpr int kSmemBytes = 0;
  StoreEpilogue<float> out;

  __device__ void start(uint8_t*, int) const {}
  __device__ void tile(uint8_t*, const float (&acc)[kBlockN / 128][64], int cw, int64_t m0, int n0, int z,
                       int) const {
    const int row0 = 64 * cw + 16 * ((threadIdx.x / 32) % 4);  // the warp's 16 rows of the tile
#pragma unroll
    for (int part = 0; part < kBlockN / 128; ++part) out.wgmma_fragments(acc[part], row0, m0, n0 + 128 * part, z);
  }
  __device__ void finish(int) const {}
};

// C = A Bᵀ for each of `batches` matrices (no split-K, rows from 0) into out (a plain store:
// no column scale), on the TMA loop, or on the cp.async one where TMA cannot reach an operand.
template <class T, Major AM, Major BMJ, class OutT>
cudaError_t launch_product(const Operand& A, const Operand& B, const GemmShape& s, int batches,
                           const StoreEpilogue<OutT>& out, cudaStream_t stream) {
  constexpr CUtensorMapDataType kOut = sizeof(OutT) == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                       : std::is_same_v<OutT, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  TmaOperands maps{};
  TmaStoreEpilogue<OutT> epi{};
  const bool tma = s.k_chunk == 0 && s.m_begin == 0 && out.col_scale.ptr == nullptr &&
                   encode_tma_operands<T, AM, BMJ>(&maps, A, B, kTmaBlockM<TmaStoreEpilogue<OutT>>,
                                                   ProductTile::kBlockN, batches) &&
                   encode_tma_matrices(&epi.out, out.ptr, out.ld, out.batch_stride, out.rows, out.cols, kOut,
                                       sizeof(OutT), 64, batches);
  if (!tma) return launch_gemm_wgmma<T, AM, BMJ>(A, B, s, batches, out, stream);
  return launch_tma_loop<T, AM, BMJ>(maps, s, batches, epi, stream);
}

// The split-K partials of a long-K product G_z = A_zᵀ B_z (K = pixels in chunks of
// s.k_chunk rows, chunks 0 .. batches; both operands MN-major: [K][rows] and
// [K][cols]) into out's [chunk][rows][cols] fp32, on the TMA loop with Tile's tiles; false where
// TMA cannot reach an operand (a row offset, an unaligned stride), for the caller's fallback.
template <class Tile, class T>
bool launch_wgrad_tma(const Operand& A, const Operand& B, const GemmShape& s, int batches,
                      const StoreEpilogue<float>& out, cudaStream_t stream, cudaError_t* err) {
  using Epi = std::conditional_t<Tile::kRegisterStores, RegisterStoreEpilogue<Tile>, TmaStoreEpilogue<float, Tile>>;
  static_assert(Tile::kSplitK, "a weight-gradient tile splits K");
  TmaOperands maps{};
  Epi epi{};
  if (out.col_scale.ptr != nullptr || s.m_begin != 0 ||
      !encode_tma_operands<T, Major::kMN, Major::kMN>(&maps, A, B, kTmaBlockM<Epi>, Tile::kBlockN, 1))
    return false;
  if constexpr (Tile::kRegisterStores) {
    epi.out = out;
  } else if (!encode_tma_matrices(&epi.out, out.ptr, out.ld, out.batch_stride, out.rows, out.cols,
                                  CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 64, batches)) {
    return false;
  }
  *err = launch_tma_loop<T, Major::kMN, Major::kMN>(maps, s, batches, epi, stream);
  return true;
}

}  // namespace tpf::trimul
