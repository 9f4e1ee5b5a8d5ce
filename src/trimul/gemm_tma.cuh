// The triangle products' main loop (K = N, batched over channels): the op's cubic work, on
// Hopper's native path. A persistent block per SM walks 128 x 256 output tiles; its producer
// warp copies each k-step's operand tiles with TMA into a ring of stages, and two consumer
// warpgroups (64 rows x 256 columns each) run m64n128k16 wgmma straight from the stages,
// keeping one k-step's batch in flight while they release the stage before it. The epilogue
// stores through TMA as well: each consumer warpgroup writes 64-row boxes of its accumulators
// into two shared slots in turn and goes on to the next tile while the copies drain, and the
// producer runs on into that tile meanwhile (stores straight from registers took 40% of the
// product's time: 4-byte pieces of eight rows per instruction). Tiles, swizzle and descriptors
// are the wgmma engine's (gemm_wgmma.cuh).
//
// Stage layout (128-byte swizzle, 1024-byte aligned, as TMA's SWIZZLE_128B writes it):
//   K-major  [rows][64 k]: one box of 128 (A) or 256 (B) rows of 128 bytes.
//   MN-major [64 k][rows]: boxes of [64 k][64 mn], 8 KB apart (the descriptors' LBO).
//   Output slots [64 rows][128 bytes]: a box of 64 (16-bit) or 32 (fp32) columns.
#pragma once
#include <cuda.h>

#include "common/tma.cuh"
#include "common/tma.h"
#include "common/warp_roles.cuh"
#include "trimul/epilogues.cuh"
#include "trimul/gemm_wgmma.cuh"

namespace tpf::trimul {

using PCfg = ProductConfig;

struct ProductMaps {
  CUtensorMap a, b, out;  // 3-D: (columns, rows, batch) of each operand and of C as stored
};

// A matrix batch as a 3-D map (columns, rows, batch) with the 128-byte swizzle and boxes of
// 128 bytes x box_rows; false where TMA cannot reach it.
inline bool encode_product_map(CUtensorMap* map, const void* ptr, int64_t ld, int64_t batch_stride, int64_t rows,
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

namespace detail {

constexpr uint32_t kProductABytes = PCfg::kBlockM * PCfg::kBlockK * 2;  // 16 KB
constexpr uint32_t kProductBBytes = PCfg::kBlockN * PCfg::kBlockK * 2;  // 32 KB
constexpr uint32_t kProductStageBytes = kProductABytes + kProductBBytes;
constexpr uint32_t kOutSlotBytes = 64 * 128;  // one output box: 64 rows of 128 bytes

// The block's output tiles in order: n fastest, then m, then the batch (tiles of one channel
// share its operands in L2).
struct ProductTiles {
  int m_tiles, n_tiles;
  int64_t total;
  int nk;  // k-steps a tile
  __device__ explicit ProductTiles(const GemmShape& s, int batches)
      : m_tiles(static_cast<int>((s.M + PCfg::kBlockM - 1) / PCfg::kBlockM)),
        n_tiles((s.N + PCfg::kBlockN - 1) / PCfg::kBlockN),
        total(int64_t{m_tiles} * n_tiles * batches),
        nk(static_cast<int>((s.K + PCfg::kBlockK - 1) / PCfg::kBlockK)) {}
  __device__ void at(int64_t t, int64_t& m0, int& n0, int& z) const {
    const int64_t per_batch = int64_t{m_tiles} * n_tiles;
    z = static_cast<int>(t / per_batch);
    const int64_t r = t % per_batch;
    m0 = (r / n_tiles) * PCfg::kBlockM;
    n0 = static_cast<int>(r % n_tiles) * PCfg::kBlockN;
  }
};

// The ring of stages and its two barriers per stage: full (the producer's copies landed) and
// empty (every consumer warp's wgmma that read it completed).
struct ProductRing {
  uint32_t base;  // shared address of stage 0 (1024-byte aligned); the output slots follow the stages
  uint32_t bars;  // full[kStages], then empty[kStages], 8 bytes each
  __device__ uint32_t a(int st) const { return base + st * kProductStageBytes; }
  __device__ uint32_t b(int st) const { return a(st) + kProductABytes; }
  __device__ uint32_t full(int st) const { return bars + 8 * st; }
  __device__ uint32_t empty(int st) const { return bars + 8 * (PCfg::kStages + st); }
  __device__ uint32_t out_slot(int cw, int k) const {
    return base + PCfg::kStages * kProductStageBytes + (2 * cw + k) * kOutSlotBytes;
  }
};

// One k-step's copies into stage st: `rows` rows of an operand from (row0, k0) of matrix z.
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
template <Major AM, Major BMJ>
__device__ void produce(const ProductMaps& maps, const ProductRing& ring, const ProductTiles& tiles) {
  int it = 0;  // k-steps issued so far: stage it % kStages, pass it / kStages
  for (int64_t t = blockIdx.x; t < tiles.total; t += gridDim.x) {
    int64_t m0;
    int n0, z;
    tiles.at(t, m0, n0, z);
    for (int kt = 0; kt < tiles.nk; ++kt, ++it) {
      const int st = it % PCfg::kStages;
      dev::mbar_wait(ring.empty(st), ((it / PCfg::kStages) & 1) ^ 1);  // a fresh barrier's "previous" phase
      dev::mbar_arrive_expect_tx(ring.full(st), kProductStageBytes);  // boxes past the extents count, zero-filled
      const int64_t k0 = int64_t{kt} * PCfg::kBlockK;
      copy_operand<AM>(ring.a(st), &maps.a, ring.full(st), PCfg::kBlockM, m0, k0, z);
      copy_operand<BMJ>(ring.b(st), &maps.b, ring.full(st), PCfg::kBlockN, n0, k0, z);
    }
  }
}

// Consumer warpgroup cw's 64 rows of the tile (rows 64 cw from m0 of matrix z) to C through
// TMA: box by box (128 bytes of columns each) into its two shared slots in turn, the slot's
// previous copy waited for first. boxes: the warpgroup's running count (a slot's parity).
template <class OutT>
__device__ void store_tile(const ProductMaps& maps, const ProductRing& ring, const float (&acc)[2][64], int cw,
                           int64_t m0, int n0, int z, int& boxes) {
  constexpr int kCols = 128 / sizeof(OutT);  // a box's columns: 64 16-bit or 32 fp32
  const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) % 4, g = lane >> 2, t = lane & 3;
  const bool leader = threadIdx.x % 128 == 0;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int b = 0; b < 128 / kCols; ++b, ++boxes) {  // boxes of this 128-column half
      const uint32_t slot = ring.out_slot(cw, boxes & 1);
      if (leader && boxes >= 2) dev::bulk_wait_read<1>();  // the copy of box boxes - 2 has left this slot
      dev::bar_sync(1 + cw, 128);
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)  // the box's n8 tiles: columns 8j + 2t, + 1 of the box
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = b * (kCols / 8) + j;  // n8 tile of the half
          const float v0 = acc[half][4 * i + 2 * h], v1 = acc[half][4 * i + 2 * h + 1];
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
        dev::tma_store_3d(&maps.out, slot, n0 + 128 * half + b * kCols, static_cast<int>(m0 + 64 * cw), z);
        dev::bulk_commit();
      }
    }
}

// A consumer warpgroup (cw: rows 64 cw of each tile): per tile, the k-steps' wgmma into acc (the
// two 128-column halves), then the tile's store.
template <class T, Major AM, Major BMJ, class OutT>
__device__ void consume(const ProductMaps& maps, const ProductRing& ring, const ProductTiles& tiles, int cw) {
  const int lane = threadIdx.x & 31;
  int it = 0, boxes = 0;
  for (int64_t t = blockIdx.x; t < tiles.total; t += gridDim.x) {
    int64_t m0;
    int n0, z;
    tiles.at(t, m0, n0, z);
    float acc[2][64];  // [column half][4 n8 + c]: the wgmma accumulator layout (common/wgmma.cuh)
    int prev = -1;     // the stage of the k-step still in flight
    for (int kt = 0; kt < tiles.nk; ++kt, ++it) {
      const int st = it % PCfg::kStages;
      dev::mbar_wait(ring.full(st), (it / PCfg::kStages) & 1);
      dev::wgmma_fence();
#pragma unroll
      for (int j = 0; j < PCfg::kBlockK / 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          dev::Wgmma<T, AM == Major::kMN, BMJ == Major::kMN>::run(
              acc[h], operand_desc<AM>(ring.a(st), 64 * cw, j), operand_desc<BMJ>(ring.b(st), 128 * h, j),
              kt > 0 || j > 0);
      dev::wgmma_commit();
      dev::wgmma_wait<1>();  // the previous k-step's batch is done: its stage is free
      if (prev >= 0 && lane == 0) dev::mbar_arrive(ring.empty(prev));
      prev = st;
    }
    dev::wgmma_wait<0>();
    dev::wgmma_fence_operands(acc[0]);
    dev::wgmma_fence_operands(acc[1]);
    if (prev >= 0 && lane == 0) dev::mbar_arrive(ring.empty(prev));
    store_tile<OutT>(maps, ring, acc, cw, m0, n0, z, boxes);
  }
  if (threadIdx.x % 128 == 0) dev::bulk_wait_all();  // the slots stay allocated until the copies read them
}

}  // namespace detail

constexpr int kProductSmemBytes = PCfg::kStages * detail::kProductStageBytes +
                                  2 * PCfg::kConsumers * detail::kOutSlotBytes + 1024 + 16 * PCfg::kStages;
static_assert(kProductSmemBytes <= 227 * 1024, "one block per SM");

template <class T, Major AM, Major BMJ, class OutT>
__global__ void __launch_bounds__(PCfg::kThreads, 1)
    gemm_product_kernel(const __grid_constant__ ProductMaps maps, const GemmShape s, const int batches) {
  static_assert(PCfg::kBlockM == 64 * PCfg::kConsumers && PCfg::kBlockN == 256 && PCfg::kBlockK == 64,
                "a consumer warpgroup owns 64 rows; two m64n128k16 a k16 step cover 256 columns");
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t raw = dev::smem_addr(smem_raw), base = raw + ((1024 - (raw & 1023)) & 1023);
  const detail::ProductRing ring{base, base + PCfg::kStages * detail::kProductStageBytes +
                                             2 * PCfg::kConsumers * detail::kOutSlotBytes};
  const detail::ProductTiles tiles(s, batches);
  if (threadIdx.x == 0) {
    for (int st = 0; st < PCfg::kStages; ++st) {
      dev::mbar_init(ring.full(st), 1);
      dev::mbar_init(ring.empty(st), 4 * PCfg::kConsumers);  // one arrival per consumer warp
    }
    dev::mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == PCfg::kConsumers) {
    dev::regs_decrease<PCfg::kProducerRegs>();
    if (threadIdx.x == 128 * PCfg::kConsumers) detail::produce<AM, BMJ>(maps, ring, tiles);
  } else {
    dev::regs_increase<PCfg::kConsumerRegs>();
    detail::consume<T, AM, BMJ, OutT>(maps, ring, tiles, wg);
  }
}

// C = A Bᵀ for each of `batches` matrices (no split-K, rows from 0) into out (a plain store:
// no column scale), on the TMA loop, or on the cp.async one where TMA cannot reach an operand.
// Grid: one block per SM, at most one per tile.
template <class T, Major AM, Major BMJ, class OutT>
cudaError_t launch_product(const Operand& A, const Operand& B, const GemmShape& s, int batches,
                           const StoreEpilogue<OutT>& out, cudaStream_t stream) {
  constexpr bool kFp16 = std::is_same_v<T, __half>;
  constexpr CUtensorMapDataType kIn = kFp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  constexpr CUtensorMapDataType kOut = sizeof(OutT) == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                       : std::is_same_v<OutT, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  ProductMaps maps{};
  // K-major boxes: 64 columns (k) x the tile's rows; MN-major: 64 x 64, two or four a tile.
  const bool tma = s.k_chunk == 0 && s.m_begin == 0 && A.row0 == 0 && B.row0 == 0 && out.col_scale.ptr == nullptr &&
                   encode_product_map(&maps.a, A.ptr, A.ld, A.batch_stride, A.rows, A.cols, kIn, 2,
                                      AM == Major::kMN ? 64 : PCfg::kBlockM, batches) &&
                   encode_product_map(&maps.b, B.ptr, B.ld, B.batch_stride, B.rows, B.cols, kIn, 2,
                                      BMJ == Major::kMN ? 64 : PCfg::kBlockN, batches) &&
                   encode_product_map(&maps.out, out.ptr, out.ld, out.batch_stride, out.rows, out.cols, kOut,
                                      sizeof(OutT), 64, batches);
  if (!tma) return launch_gemm_wgmma<T, AM, BMJ>(A, B, s, batches, out, stream);
  auto* kernel = gemm_product_kernel<T, AM, BMJ, OutT>;
  cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, kProductSmemBytes);
  int device = 0, sms = 0;
  if (e != cudaSuccess || (e = cudaGetDevice(&device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return e;
  const int64_t tiles = ((s.M + PCfg::kBlockM - 1) / PCfg::kBlockM) * ((s.N + PCfg::kBlockN - 1) / PCfg::kBlockN) *
                        int64_t{batches};
  if (tiles == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  kernel<<<grid, PCfg::kThreads, kProductSmemBytes, stream>>>(maps, s, batches);
  return cudaGetLastError();
}

}  // namespace tpf::trimul
