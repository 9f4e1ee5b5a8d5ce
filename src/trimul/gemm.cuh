// A tensor-core GEMM with a pluggable epilogue, the engine of every multiplicative-update
// product:   C[m, n] = sum_k A[m, k] B[n, k]   (fp32 accumulation, 16-bit operands).
//
// Each operand is stored either K-major (element (mn, k) at mn*ld + k) or MN-major ((mn, k) at
// k*ld + mn); the K-major tile goes through ldmatrix, the MN-major one through ldmatrix.trans,
// so the triangle product's four transposition patterns (outgoing/incoming, forward/backward)
// and the weight-gradient products dW = dYᵀ X all run on the same main loop without copies.
//
// blockIdx.z is either a batch index (operands advance by batch_stride) or, for split-K, the
// index of a chunk of k_chunk rows of K. The epilogue receives the fp32 tile in shared memory,
// or the accumulators in registers (fragments(), for element-wise epilogues), and writes
// whatever its stage needs, in whatever walk order coalesces its stores.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/kernel_attrs.h"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "trimul/tile_config.h"

namespace tpf::trimul {

enum class Major : int { kK = 0, kMN = 1 };

// A batch of 2-D matrices. Stored extents: K-major rows = M (or N) and cols = K; MN-major
// rows = K and cols = M (or N). Reads past the extents return zero; cols must be a multiple of
// 8 and ld of 8 elements (16-byte chunks; the host pads the channel-major buffers).
// row0: the first stored row (rows are numbered as the whole matrix's, so a buffer holding
// rows row0 .. of a larger one reads as that matrix; extents stay the whole matrix's).
struct Operand {
  const void* ptr;
  int64_t ld;
  int64_t batch_stride;
  int64_t rows, cols;
  int64_t row0 = 0;
};

// m_begin: the first output row the grid covers (a multiple of kBlockM; rows m_begin .. M), so
// that a call can cover a range of a product's rows and still index the whole product. A split
// K starts at row 0: a call over part of a product's K addresses its operands from that part.
struct GemmShape {
  int64_t M;
  int N;
  int64_t K;
  int64_t k_chunk;  // split-K: the K rows of blockIdx.z; 0: no split (blockIdx.z = batch)
  int64_t m_begin = 0;
};

using Cfg = GemmConfig;

// The accumulator tile as the epilogue sees it: [kBlockM][kEpiStride] fp32, plus a small
// scratch area for column reductions.
struct EpiTile {
  float* c;        // [kBlockM][kEpiStride]
  float* scratch;  // [kThreads]
  int64_t* rows;   // [kBlockM] per-row offsets an epilogue may precompute (row_offsets)
  void* extra;     // [kEpiExtraBytes] past the pixel-major tile (16-byte aligned)
  bool prefetched;  // the epilogue's prefetch (below) filled the extra area
  __device__ float& at(int r, int n) const { return c[r * Cfg::kEpiStride + n]; }
  // The same element when the epilogue asked for channel-major staging (channel_major_tile).
  __device__ float& at_cm(int r, int n) const { return c[n * Cfg::kEpiStrideCm + r]; }
};

// An epilogue may stage some tiles channel-major by defining channel_major_tile(n0).
template <class Epi, class = void>
struct HasChannelMajorTiles : std::false_type {};
template <class Epi>
struct HasChannelMajorTiles<Epi, std::void_t<decltype(std::declval<const Epi&>().channel_major_tile(0))>>
    : std::true_type {};
template <class Epi>
__device__ __forceinline__ bool stages_channel_major(const Epi& epi, int n0) {
  if constexpr (HasChannelMajorTiles<Epi>::value) return epi.channel_major_tile(n0);
  else return false;
}

// An epilogue may load its own operand into the extra area while the main loop runs, by
// defining `bool prefetch(void* extra, int64_t m0, int n0)` (cp.async; false: it did not). The
// kernel calls it only when the loop leaves the last operand stage unused (K <= (kStages - 1)
// kBlockK, the short-K products), whose bytes the extra area reuses.
template <class Epi, class = void>
struct HasPrefetch : std::false_type {};
template <class Epi>
struct HasPrefetch<Epi, std::void_t<decltype(std::declval<const Epi&>().prefetch(nullptr, int64_t{0}, 0))>>
    : std::true_type {};

// A warp's accumulators in mma.sync's C-fragment layout: [m16 tile][n8 tile][4], thread
// (g = lane / 4, t = lane % 4) holding rows g and g + 8, columns 2t and 2t + 1 of each m16n8.
constexpr int kFragMi = Cfg::kWarpTileM / 16, kFragNi = Cfg::kWarpTileN / 8;
using AccFragments = float[kFragMi][kFragNi][4];

// An epilogue may take the accumulators from registers instead of a staged tile by defining
// `fragments(const EpiTile&, const AccFragments&, int wm, int wn, int64_t m0, int n0)` (wm, wn:
// the warp's first row and column in the tile); the whole tile area is then the epilogue's. It
// returns void (every tile), or bool: false (uniform over the block, before it touches shared
// memory) hands the tile to the staged path and operator().
template <class Epi>
using FragmentsResult = decltype(std::declval<const Epi&>().fragments(
    std::declval<const EpiTile&>(), std::declval<const AccFragments&>(), 0, 0, int64_t{0}, 0));
template <class Epi, class = void>
struct HasFragmentEpilogue : std::false_type {};
template <class Epi>
struct HasFragmentEpilogue<Epi, std::void_t<FragmentsResult<Epi>>> : std::true_type {};
template <class Epi>
constexpr bool fragments_only() {
  if constexpr (HasFragmentEpilogue<Epi>::value) return std::is_void_v<FragmentsResult<Epi>>;
  else return false;
}

// A tile of 16-bit values staged row-major from registers: [128 rows][128 columns] (32 KB), the
// 16-byte chunk k of row r at k ^ (r % 8), so that the eight rows of one stmatrix matrix and the
// sixteen chunks of one row that a half-warp reads back fall in distinct banks.
struct Staged16 {
  uint8_t* base;
  __device__ static int chunk_at(int r, int k) { return r * Cfg::kBlockN * 2 + ((k ^ (r & 7)) << 4); }  // bytes
  // One m16 tile of a warp's fragments: pk[n][h], the thread's packed pair (columns wn + 8n + 2t,
  // + 1) at row wm + 16 mi + 8h + g. (Per m16 tile, so that few packed values are live at once.)
  __device__ void put(int mi, const uint32_t (&pk)[kFragNi][2], int wm, int wn) const {
    const int lane = threadIdx.x & 31, mx = lane >> 3, j = lane & 7;
    const uint32_t s = dev::smem_addr(base);
#pragma unroll
    for (int k = 0; k < kFragNi / 2; ++k) {  // matrices (h, n) = (0, 2k), (0, 2k + 1), (1, 2k), (1, 2k + 1)
      const uint32_t r[4] = {pk[2 * k][0], pk[2 * k + 1][0], pk[2 * k][1], pk[2 * k + 1][1]};
      const int row = wm + 16 * mi + 8 * (mx >> 1) + j, chunk = (wn + 8 * (2 * k + (mx & 1))) / 8;
      dev::stmatrix_x4(s + chunk_at(row, chunk), r);
    }
  }
  // The 16 bytes (8 columns from 8k) of row r.
  __device__ uint4 get(int r, int k) const { return *reinterpret_cast<const uint4*>(base + chunk_at(r, k)); }
};
// Fixed-order column totals of a fragment epilogue's per-thread sums s[i] over its rows (tile
// column col(i)): the warp's 8 row groups by a shuffle tree, then the block's two row halves in
// order. Thread n < 128 gets column n's total. Every thread calls it; it synchronises (the
// scratch may be read by the caller before: nothing of it survives).
template <int kN, class Col>
__device__ __forceinline__ float fragment_column_sums(const EpiTile& t, float (&s)[kN], int wm, Col&& col) {
#pragma unroll
  for (int o = 4; o < 32; o <<= 1)
#pragma unroll
    for (int i = 0; i < kN; ++i) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
  __syncthreads();
  if ((threadIdx.x & 31) < 4)
#pragma unroll
    for (int i = 0; i < kN; ++i) t.scratch[(wm / Cfg::kWarpTileM) * Cfg::kBlockN + col(i)] = s[i];
  __syncthreads();
  static_assert(Cfg::kWarpsM == 2, "two row halves");
  return threadIdx.x < Cfg::kBlockN ? t.scratch[threadIdx.x] + t.scratch[Cfg::kBlockN + threadIdx.x] : 0.f;
}

// Chunks of a staged tile per thread when the block walks it row by row (16 lanes per row).
constexpr int kStagedChunksPerThread = Cfg::kBlockM * Cfg::kBlockN / 8 / Cfg::kThreads;

// cp.async of a 16-bit [128 rows][128 columns] tile into Staged16's layout at shared address s:
// row r's columns n0 .. n0 + 127 from row_ptr(r) (nullptr past the rows), columns past `cols`
// (a multiple of 8) zero-filled. The caller commits and waits.
template <class T, class RowPtr>
__device__ __forceinline__ void stage16_async(uint32_t s, RowPtr&& row_ptr, int n0, int64_t cols) {
#pragma unroll 1  // a prologue loop: registers are scarcer than issue slots before a main loop
  for (int i = 0; i < kStagedChunksPerThread; ++i) {
    const int q = threadIdx.x + i * Cfg::kThreads, r = q / 16, k = q % 16;
    const T* row = row_ptr(r);
    const bool in = row != nullptr && n0 + 8 * k < cols;
    dev::cp_async_16(s + Staged16::chunk_at(r, k), in ? row + n0 + 8 * k : row_ptr(0), in);
  }
}

// Vector walk of the tile for epilogues that store pixel-major: each lane owns kVec consecutive
// columns (one 16-byte store of 16-bit values for kVec = 8, of fp32 for kVec = 4) of kItems
// rows. A warp covers kVec rows x 32 columns per item, lane (r_in = lane % kVec, j = lane /
// kVec) at banks r_in + kVec j + const of the 129-float rows: every bank once per read. Two
// warps share a 32-column block, so a lane's columns are the same in every item and its column
// sums need no more than a shuffle tree and one two-way combine (vector_column_sums).
template <int kVec>
struct VecWalk {
  static_assert(kVec == 4 || kVec == 8, "16-byte groups of fp32 or 16-bit values");
  static constexpr int kColBlocks = Cfg::kBlockN / 32;
  static constexpr int kWarpsPerBlock = Cfg::kThreads / 32 / kColBlocks;
  static constexpr int kItems = Cfg::kBlockM / kVec / kWarpsPerBlock;  // rows per lane
  static_assert(kWarpsPerBlock == 2, "vector_column_sums combines two warps");
  int r_in, j, warp;
  __device__ VecWalk() : r_in(threadIdx.x % kVec), j((threadIdx.x & 31) / kVec), warp(threadIdx.x >> 5) {}
  __device__ int col() const { return (warp / kWarpsPerBlock) * 32 + j * kVec; }  // first of kVec
  __device__ int row(int k) const { return ((warp % kWarpsPerBlock) * kItems + k) * kVec + r_in; }
  __device__ void read(const EpiTile& t, int k, float (&v)[kVec]) const {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = t.at(row(k), col() + e);
  }
};

// Fixed-order totals of per-lane column sums s[e] (columns w.col() + e over the lane's rows):
// a shuffle tree over the kVec lanes of a column group, then the two warps of the block in
// order. Thread n < 128 gets column n's total. Every thread of the block must call it.
template <int kVec>
__device__ __forceinline__ float vector_column_sums(const EpiTile& t, const VecWalk<kVec>& w,
                                                    float (&s)[kVec]) {
#pragma unroll
  for (int o = 1; o < kVec; o <<= 1)
#pragma unroll
    for (int e = 0; e < kVec; ++e) s[e] += __shfl_xor_sync(0xffffffffu, s[e], o);
  __syncthreads();  // the scratch may still be read by a previous call or a staged vector
  if (w.r_in == 0)
#pragma unroll
    for (int e = 0; e < kVec; ++e) t.scratch[(w.warp % 2) * Cfg::kBlockN + w.col() + e] = s[e];
  __syncthreads();
  return threadIdx.x < Cfg::kBlockN ? t.scratch[threadIdx.x] + t.scratch[Cfg::kBlockN + threadIdx.x] : 0.f;
}

// 16 bytes of kVec values from kVec floats (fp32, or rounded to the 16-bit T).
template <class T, int kVec>
__device__ __forceinline__ uint4 pack16(const float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  } else {
    return dev::pack8<T>(v);
  }
}

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Fills t.rows[r] = f(r) for the tile's rows (one call per row instead of per element: the
// pixel decompositions behind these offsets are integer divisions). Synchronises.
template <class F>
__device__ __forceinline__ void row_offsets(const EpiTile& t, F&& f) {
  if (threadIdx.x < Cfg::kBlockM) t.rows[threadIdx.x] = f(static_cast<int>(threadIdx.x));
  __syncthreads();
}

namespace detail {

constexpr int kTileElems = Cfg::kBlockM * Cfg::kBlockK;  // per operand per stage (BM == BN)
static_assert(Cfg::kBlockM == Cfg::kBlockN, "operand tiles share one geometry");

// One operand's share of a thread in every k-step tile: [128 mn][64 k] (K-major) or
// [64 k][128 mn] (MN-major), 16-byte chunks, kPasses chunks per thread that sit kRowsPerPass
// tile rows apart. Everything that does not depend on the k-step (global pointer, swizzled
// shared offset, which chunks lie inside the mn extent) is computed once per tile, so a k-step
// costs one pointer advance and a compare per chunk: the address arithmetic of a per-chunk
// (row, chunk) decomposition used to outnumber the MMAs several times over.
//
// kWgmma: MN-major tiles in the layout wgmma reads with 128-byte swizzling (two [64 k][64 mn]
// halves of 8 KB, 128-byte rows, chunk c of row r at c ^ (r & 7)) instead of [64 k][128 mn]
// rows of 256 bytes. K-major tiles ([128][64], 128-byte rows, the same XOR) suit both paths.
template <Major MAJ, class T, bool kWgmma = false>
struct TileLoader {
  static constexpr int kW = MAJ == Major::kK ? Cfg::kBlockK : Cfg::kBlockM;  // tile row, elements
  static constexpr int kChunksPerRow = kW / 8;
  static constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
  static constexpr int kPasses = kTileElems / 8 / Cfg::kThreads;
  static constexpr bool kHalves = kWgmma && MAJ == Major::kMN;
  static constexpr int kHalfElems = Cfg::kBlockK * 64;                 // one [64 k][64 mn] half
  static constexpr int kSmemRow = kHalves ? 64 : kW;                   // smem row, elements
  static_assert(kRowsPerPass % 8 == 0, "the swizzle (row & 7) is the same in every pass");

  const T* src;        // this thread's chunk of pass 0 at k = 0
  int64_t ld;          // global row stride (passes are kRowsPerPass rows apart)
  int64_t k_limit;     // K-major: extent of k (cols); MN-major: of the k rows
  int smem_off;        // tile elements, pass 0 (passes add kRowsPerPass * kW)
  int k_lane;          // K-major: this chunk's k offset; MN-major: its k row
  uint32_t mn_ok;      // bit p: pass p's chunk lies inside the mn extent
  int64_t k_origin = 0;  // MN-major: the k row the buffer starts at (Operand::row0)

  __device__ TileLoader(const T* base, const Operand& op, int64_t mn0) : ld(op.ld) {
    const int r0 = threadIdx.x / kChunksPerRow, ch = threadIdx.x % kChunksPerRow;
    smem_off = kHalves ? (ch / 8) * kHalfElems + r0 * 64 + ((ch % 8) ^ (r0 & 7)) * 8
                       : r0 * kW + dev::swizzle<kW>(r0, ch) * 8;
    mn_ok = 0;
    if constexpr (MAJ == Major::kK) {  // tile row = mn, chunk = k
      src = base + (mn0 - op.row0 + r0) * op.ld + ch * 8;
      k_lane = ch * 8, k_limit = op.cols;
#pragma unroll
      for (int p = 0; p < kPasses; ++p) mn_ok |= uint32_t(mn0 + r0 + p * kRowsPerPass < op.rows) << p;
    } else {  // tile row = k, chunk = mn
      src = base + r0 * op.ld + mn0 + ch * 8;
      k_origin = op.row0;
      k_lane = r0, k_limit = op.rows;
      mn_ok = mn0 + ch * 8 < op.cols ? (1u << kPasses) - 1 : 0u;
    }
  }

  __device__ __forceinline__ void load(T* tile, int64_t k0) const {
    const T* g = src + (MAJ == Major::kK ? k0 : (k0 - k_origin) * ld);
    const uint32_t s = dev::smem_addr(tile + smem_off);
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t k = k0 + k_lane + (MAJ == Major::kK ? 0 : p * kRowsPerPass);
      const bool valid = ((mn_ok >> p) & 1u) && k < k_limit;
      // Out-of-range chunks copy 0 bytes (zero fill): their address is never read.
      dev::cp_async_16(s + p * kRowsPerPass * kSmemRow * int(sizeof(T)), g + p * kRowsPerPass * ld, valid);
    }
  }
};

// The m16k16 A fragment of rows [mr, mr + 16) at k-step ks of the tile.
template <Major MAJ, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int mr, int ks) {
  const int lane = threadIdx.x & 31, j = lane >> 3, i = lane & 7;
  if constexpr (MAJ == Major::kK) {
    dev::ldmatrix_x4(a, dev::tile_at<Cfg::kBlockK>(tile, mr + (j & 1) * 8 + i, ks * 2 + (j >> 1)));
  } else {
    dev::ldmatrix_x4_trans(a, dev::tile_at<Cfg::kBlockM>(tile, ks * 16 + (j >> 1) * 8 + i, mr / 8 + (j & 1)));
  }
}

// Two k16n8 B fragments (columns [nc, nc + 16)) at k-step ks: {b0, b1} of each n8 tile.
template <Major MAJ, class T>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const T* tile, int nc, int ks) {
  const int lane = threadIdx.x & 31, j = lane >> 3, i = lane & 7;
  if constexpr (MAJ == Major::kK) {
    dev::ldmatrix_x4(b, dev::tile_at<Cfg::kBlockK>(tile, nc + (j >> 1) * 8 + i, ks * 2 + (j & 1)));
  } else {
    dev::ldmatrix_x4_trans(b, dev::tile_at<Cfg::kBlockN>(tile, ks * 16 + (j & 1) * 8 + i, nc / 8 + (j >> 1)));
  }
}

}  // namespace detail

constexpr int kStageBytes = 2 * detail::kTileElems * 2;  // A and B, 16-bit
static_assert(Cfg::kBlockN * Cfg::kEpiStrideCm <= Cfg::kStages * kStageBytes / 4,
              "channel-major staging fits where the operand stages were");
constexpr int kEpiTileBytes = Cfg::kBlockM * Cfg::kEpiStride * 4;
static_assert(kEpiTileBytes % 16 == 0, "the extra area starts 16-byte aligned");
// Operand stages, or the epilogue's tile and extra area (they reuse the stages' bytes), then
// the scratch and row-offset areas.
constexpr int kGemmSmemBytes =
    (Cfg::kStages * kStageBytes > kEpiTileBytes + Cfg::kEpiExtraBytes ? Cfg::kStages * kStageBytes
                                                                       : kEpiTileBytes + Cfg::kEpiExtraBytes) +
    Cfg::kThreads * 4 + Cfg::kBlockM * 8;
static_assert(2 * kGemmSmemBytes <= 227 * 1024, "two blocks per SM");
static_assert(kEpiTileBytes >= (Cfg::kStages - 1) * kStageBytes,
              "the extra area lies in the last operand stage (or past the stages): a prefetch "
              "into it does not overlap the stages a short-K main loop uses");

// The epilogue's view of a block's shared memory (kGemmSmemBytes from `smem`).
__device__ __forceinline__ EpiTile epi_tile(uint8_t* smem, bool prefetched) {
  constexpr int kRowsAt = kGemmSmemBytes - Cfg::kBlockM * 8;
  return {reinterpret_cast<float*>(smem), reinterpret_cast<float*>(smem + kRowsAt - Cfg::kThreads * 4),
          reinterpret_cast<int64_t*>(smem + kRowsAt), smem + kEpiTileBytes, prefetched};
}

// The block's output tile and K range. Tiles in n-fastest order: the blocks sharing an A row
// block run together and read it from L2 once (the projections have 5 n-tiles over the same
// 128 pixel rows). blockIdx.z: batch, or split-K chunk.
struct BlockTile {
  int64_t m0;
  int n0, z;
  int64_t k_begin;
  int nk;  // k-steps
  __device__ explicit BlockTile(const GemmShape& s) {
    const int n_tiles = (s.N + Cfg::kBlockN - 1) / Cfg::kBlockN;
    m0 = s.m_begin + int64_t(blockIdx.x / n_tiles) * Cfg::kBlockM;
    n0 = static_cast<int>(blockIdx.x % n_tiles) * Cfg::kBlockN;
    z = blockIdx.z;
    k_begin = s.k_chunk ? z * s.k_chunk : 0;
    const int64_t k_end = s.k_chunk ? min(s.K, k_begin + s.k_chunk) : s.K;
    nk = static_cast<int>((k_end - k_begin + Cfg::kBlockK - 1) / Cfg::kBlockK);
  }
};

// Both operands' loaders for one block: load(st, k0) fills stage st with the k-step at k0.
template <class T, Major AM, Major BMJ, bool kWgmma>
struct StageLoader {
  uint8_t* smem;
  detail::TileLoader<AM, T, kWgmma> a;
  detail::TileLoader<BMJ, T, kWgmma> b;
  __device__ StageLoader(uint8_t* smem_, const Operand& A, const Operand& B, const GemmShape& s, const BlockTile& bt)
      : smem(smem_),
        a(static_cast<const T*>(A.ptr) + (s.k_chunk ? 0 : bt.z * A.batch_stride), A, bt.m0),
        b(static_cast<const T*>(B.ptr) + (s.k_chunk ? 0 : bt.z * B.batch_stride), B, bt.n0) {}
  __device__ T* stage_a(int st) const { return reinterpret_cast<T*>(smem + st * kStageBytes); }
  __device__ T* stage_b(int st) const { return stage_a(st) + detail::kTileElems; }
  __device__ void load(int st, int64_t k0) const {
    a.load(stage_a(st), k0);
    b.load(stage_b(st), k0);
  }
};

// The accumulators into the epilogue's tile: put(at) assigns at(r, n) = value for each, with
// `at` addressing the pixel-major tile, or the channel-major one where the epilogue asks.
template <class Epi, class Put>
__device__ __forceinline__ void stage_accumulators(const Epi& epi, const EpiTile& tile, int n0, Put&& put) {
  if (stages_channel_major(epi, n0)) put([&](int r, int n) -> float& { return tile.at_cm(r, n); });
  else put([&](int r, int n) -> float& { return tile.at(r, n); });
  __syncthreads();
}

template <class T, Major AM, Major BMJ, class Epi>
__global__ void __launch_bounds__(Cfg::kThreads, 2)
    gemm_kernel(const Operand A, const Operand B, const GemmShape s, const Epi epi) {
  extern __shared__ __align__(128) uint8_t smem[];
  const BlockTile bt(s);
  const int64_t m0 = bt.m0, k_begin = bt.k_begin;
  const int n0 = bt.n0, z = bt.z, nk = bt.nk;
  const StageLoader<T, AM, BMJ, false> ld(smem, A, B, s, bt);
  auto stage_a = [&](int st) { return ld.stage_a(st); };
  auto stage_b = [&](int st) { return ld.stage_b(st); };
  auto load = [&](int st, int64_t k0) { ld.load(st, k0); };

  const int warp = threadIdx.x >> 5;
  const int wm = (warp / Cfg::kWarpsN) * Cfg::kWarpTileM;  // warp's first row in the tile
  const int wn = (warp % Cfg::kWarpsN) * Cfg::kWarpTileN;  // and first column
  constexpr int kMi = kFragMi, kNi = kFragNi;
  AccFragments acc = {};  // [m16 tile][n8 tile][C fragment]

  bool prefetched = false;
  if constexpr (HasPrefetch<Epi>::value) {
    if (nk <= Cfg::kStages - 1) prefetched = epi.prefetch(smem + kEpiTileBytes, m0, n0);
    dev::cp_async_commit();  // its own group, oldest: complete before stage 0 is
  }
#pragma unroll
  for (int st = 0; st < Cfg::kStages - 1; ++st) {
    if (st < nk) load(st, k_begin + int64_t(st) * Cfg::kBlockK);
    dev::cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    dev::cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();
    const int pre = kt + Cfg::kStages - 1;
    if (pre < nk) load(pre % Cfg::kStages, k_begin + int64_t(pre) * Cfg::kBlockK);
    dev::cp_async_commit();
    const T* ta = stage_a(kt % Cfg::kStages);
    const T* tb = stage_b(kt % Cfg::kStages);
#pragma unroll
    for (int ks = 0; ks < Cfg::kBlockK / 16; ++ks) {
      uint32_t af[kMi][4];      // A fragments: [m16 tile][m16k16 registers]
      uint32_t bf[kNi / 2][4];  // B fragments: [pair of n8 tiles][b0, b1 of each]
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) detail::load_a<AM>(af[mi], ta, wm + mi * 16, ks);
#pragma unroll
      for (int np = 0; np < kNi / 2; ++np) detail::load_b<BMJ>(bf[np], tb, wn + np * 16, ks);
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni)
          dev::MmaOp<T>::run(acc[mi][ni], af[mi], bf[ni / 2][(ni & 1) * 2], bf[ni / 2][(ni & 1) * 2 + 1]);
    }
  }
  dev::cp_async_wait<0>();
  __syncthreads();

  const EpiTile tile = epi_tile(smem, prefetched);
  if constexpr (fragments_only<Epi>()) {
    epi.fragments(tile, acc, wm, wn, m0, n0);
  } else {
    if constexpr (HasFragmentEpilogue<Epi>::value) {
      if (epi.fragments(tile, acc, wm, wn, m0, n0)) return;
    }
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    stage_accumulators(epi, tile, n0, [&](auto&& at) {
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) {
          const int r = wm + mi * 16 + g, n = wn + ni * 8 + 2 * t;
          at(r, n) = acc[mi][ni][0];
          at(r, n + 1) = acc[mi][ni][1];
          at(r + 8, n) = acc[mi][ni][2];
          at(r + 8, n + 1) = acc[mi][ni][3];
        }
    });
    epi(tile, m0, n0, z);
  }
}

// One block per 128 x 128 output tile (x) and batch or split-K chunk (z).
template <class Epi>
cudaError_t launch_tiles(void (*kernel)(Operand, Operand, GemmShape, Epi), int smem_bytes, const Operand& A,
                         const Operand& B, const GemmShape& s, int batches, const Epi& epi, cudaStream_t stream) {
  if (const cudaError_t e = tpf::detail::allow_dynamic_smem(kernel, smem_bytes); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(((s.M - s.m_begin + Cfg::kBlockM - 1) / Cfg::kBlockM) *
                                        ((s.N + Cfg::kBlockN - 1) / Cfg::kBlockN)),
                  1, static_cast<unsigned>(batches));
  kernel<<<grid, Cfg::kThreads, smem_bytes, stream>>>(A, B, s, epi);
  return cudaGetLastError();
}

// Launches C = A Bᵀ over `batches` matrices (or split-K chunks when s.k_chunk != 0).
template <class T, Major AM, Major BMJ, class Epi>
cudaError_t launch_gemm(const Operand& A, const Operand& B, const GemmShape& s, int batches,
                        const Epi& epi, cudaStream_t stream) {
  return launch_tiles<Epi>(gemm_kernel<T, AM, BMJ, Epi>, kGemmSmemBytes, A, B, s, batches, epi, stream);
}

}  // namespace tpf::trimul
