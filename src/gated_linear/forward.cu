// The fused gated output projection's forward on Hopper (sm_90a): for each 64-row tile,
//   h = sigmoid(g) o               in registers, rounded to bf16, as the A fragments of
//   y = h W^T + bias               m64n128k16 x 8, W resident in shared memory
//   out = x + scale y   or   y     a row pass over y, rounded to bf16 and staged
// The unfused path's h and y (bf16) are never written: per row it reads g, o and x and writes
// out, 1.5 KB with fp32 x, which at N = 768 (589,824 rows) is 0.91 GB, 0.19 ms at 4.8 TB/s;
// the product, 19 GFLOP, is far under that.
#include "activation/gate_math.cuh"
#include "gated_linear/parts.cuh"

namespace tpf::gated {
namespace {

struct Smem {  // byte offsets of the dynamic window (1024-byte aligned: the weight's swizzle)
  static constexpr uint32_t g = kWeightBytes, o = g + Rows16::kSize, y = o + Rows16::kSize;
  static constexpr uint32_t bytes = y + Rows16::kSize;
};

// h = sigmoid(g) o for this thread's A-fragment positions of the staged tile.
__device__ __forceinline__ void gated_fragments(uint32_t (&h)[kSteps][4], Rows16 gs, Rows16 os, const Frag& f) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const bf16* g = gs.row<bf16>(f.row0 + 8 * rr) + f.col;  // [K] from this thread's column
    const bf16* o = os.row<bf16>(f.row0 + 8 * rr) + f.col;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float2 gv = load2(g + 16 * kk + 8 * hh), ov = load2(o + 16 * kk + 8 * hh);
        h[kk][2 * hh + rr] = dev::MmaOp<bf16>::pack(act::sigmoid(gv.x) * ov.x, act::sigmoid(gv.y) * ov.y);
      }
  }
}

// y = round(acc + bias) staged at the accumulator positions.
__device__ __forceinline__ void stage_y(const float (&acc)[64], const bf16* bias, Rows16 ys, const Frag& f) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    bf16* y = ys.row<bf16>(f.row0 + 8 * rr) + f.col;
#pragma unroll
    for (int i = 0; i < kTiles8; ++i) {
      const float2 b = bias ? load2(bias + 8 * i + f.col) : make_float2(0.f, 0.f);
      store2(y + 8 * i, acc[4 * i + 2 * rr] + b.x, acc[4 * i + 2 * rr + 1] + b.y);
    }
  }
}

// out = x + scale y (or y) in row pieces from the staged y.
template <class Tout>
__device__ __forceinline__ void residual_rows(const FwdArgs& a, Rows16 ys, int64_t m0) {
  const int64_t rows = row_count(a.shape);
#pragma unroll
  for (int k0 = 0; k0 < kPassPieces; k0 += kBatch) {
    float x[kBatch][kVec], s[kBatch][kVec];  // [piece][channel c + e]
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const Piece p(k0 + k);
      const int64_t row = m0 + p.r;
      if (a.x && row < rows) {
        residual::load8(x[k], static_cast<const Tout*>(a.x) + row * kN + p.c);
        residual::load_scale<bf16>(s[k], a.shape, a.scale, row, p.c);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const Piece p(k0 + k);
      const int64_t row = m0 + p.r;
      if (row >= rows) continue;
      float y[kVec];
      residual::load8(y, ys.row<bf16>(p.r) + p.c);
      if (a.x)
#pragma unroll
        for (int e = 0; e < kVec; ++e) y[e] = x[k][e] + s[k][e] * y[e];
      residual::store8(static_cast<Tout*>(a.out) + row * kN + p.c, y);
    }
  }
}

// Copy groups in flight: g, o of the next tile, issued once this tile's fragments are built.
template <class Tout>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) forward_kernel(FwdArgs a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const Rows16 gs{smem + Smem::g}, os{smem + Smem::o}, ys{smem + Smem::y};
  const int64_t rows = row_count(a.shape), step = int64_t(gridDim.x) * kTileRows;
  auto issue_gate = [&](int64_t m0) {
    if (m0 < rows) gs.issue(a.g, a.ld_g * 2, m0, rows), os.issue(a.o, a.ld_o * 2, m0, rows);
    dev::cp_async_commit();
  };
  issue_gate(int64_t(blockIdx.x) * kTileRows);
  load_weight(reinterpret_cast<bf16*>(smem), a.w, false);  // B(n, k) = W[n][k]
  const Frag f;
  for (int64_t m0 = int64_t(blockIdx.x) * kTileRows; m0 < rows; m0 += step) {
    staged_ready<0>();  // g, o of m0; the previous tile's y read out
    uint32_t h[kSteps][4];
    gated_fragments(h, gs, os, f);
    float acc[64];  // y - bias at the accumulator positions
    project(acc, h, dev::smem_addr(smem));
    stage_y(acc, a.bias, ys, f);
    __syncthreads();  // g, o read; y staged
    issue_gate(m0 + step);
    residual_rows<Tout>(a, ys, m0);
  }
}

template <class Tout>
cudaError_t launch(const FwdArgs& a, cudaStream_t stream) {
  unsigned blocks = 0;
  if (cudaError_t e = grid_for(forward_kernel<Tout>, row_count(a.shape), Smem::bytes, &blocks); e != cudaSuccess)
    return e;
  forward_kernel<Tout><<<blocks, kThreads, Smem::bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t forward(const FwdArgs& a, cudaStream_t stream) {
  if (row_count(a.shape) == 0) return cudaSuccess;
  return a.out_dtype == DType::kFP32 ? launch<float>(a, stream) : launch<bf16>(a, stream);
}

}  // namespace tpf::gated
