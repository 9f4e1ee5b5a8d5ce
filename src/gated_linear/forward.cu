// The fused gated output projection's forward on Hopper (sm_90a): for each 64-row tile,
//   h = sigmoid(g) o               in registers, rounded to bf16, as the A fragments of
//   y = h W^T + bias               m64n128k16 x 8, W resident in shared memory
//   out = x + scale y   or   y     written from the accumulators' positions
// The unfused path's h and y (bf16) are never written: per row it reads g, o and x and writes
// out, 1.5 KB with fp32 x, which at N = 768 (589,824 rows) is 0.91 GB, 0.19 ms at 4.8 TB/s;
// the product, 19 GFLOP, is far under that.
#include "activation/gate_math.cuh"
#include "gated_linear/parts.cuh"

namespace tpf::gated {
namespace {

// h = sigmoid(g) o for this thread's A-fragment positions of the tile at m0 (zeros past the end).
__device__ __forceinline__ void gated_fragments(uint32_t (&h)[kSteps][4], const FwdArgs& a, int64_t m0, const Frag& f) {
  const int64_t rows = a.rows.count();
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = m0 + f.row0 + 8 * rr;
    const bf16* g = a.g + r * a.ld_g + f.col;  // [K] row r, from this thread's column
    const bf16* o = a.o + r * a.ld_o + f.col;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int c = 16 * kk + 8 * hh;
        const float2 gv = r < rows ? load2(g + c) : make_float2(0.f, 0.f);
        const float2 ov = r < rows ? load2(o + c) : make_float2(0.f, 0.f);
        h[kk][2 * hh + rr] = dev::MmaOp<bf16>::pack(act::sigmoid(gv.x) * ov.x, act::sigmoid(gv.y) * ov.y);
      }
  }
}

// out = x + scale round(y) (or round(y)) from the accumulators, y = acc + bias.
template <class Tout>
__device__ __forceinline__ void store_out(const float (&acc)[64], const FwdArgs& a, int64_t m0, const Frag& f) {
  const int64_t rows = a.rows.count();
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = m0 + f.row0 + 8 * rr;
    if (r >= rows) continue;
    const bf16* s = a.x ? scale_row(a.scale, a.rows, r) : nullptr;
    const Tout* x = a.x ? static_cast<const Tout*>(a.x) + r * kN + f.col : nullptr;  // [N] row r
    Tout* out = static_cast<Tout*>(a.out) + r * kN + f.col;
    float2 xv[kTiles8];  // x at the tile's columns 8 i + 2 t, + 1, loaded first: one latency
#pragma unroll
    for (int i = 0; i < kTiles8; ++i) xv[i] = x ? load2(x + 8 * i) : make_float2(0.f, 0.f);
#pragma unroll
    for (int i = 0; i < kTiles8; ++i) {
      const int n = 8 * i + f.col;
      const float2 b = a.bias ? load2(a.bias + n) : make_float2(0.f, 0.f);
      float y0 = round_bf16(acc[4 * i + 2 * rr] + b.x), y1 = round_bf16(acc[4 * i + 2 * rr + 1] + b.y);
      if (x) {
        const float2 sc = scale_at(s, a.scale, n);
        y0 = xv[i].x + sc.x * y0, y1 = xv[i].y + sc.y * y1;
      }
      store2(out + 8 * i, y0, y1);
    }
  }
}

template <class Tout>
__global__ void __launch_bounds__(kThreads, kForwardBlocks) forward_kernel(FwdArgs a) {
  __shared__ __align__(1024) bf16 w_tile[kN * kK];  // B(n, k) = W[n][k], [2 halves][128][64]
  load_weight(w_tile, a.w, false);
  const Frag f;
  for (int64_t m0 = int64_t(blockIdx.x) * kTileRows; m0 < a.rows.count(); m0 += int64_t(gridDim.x) * kTileRows) {
    uint32_t h[kSteps][4];
    gated_fragments(h, a, m0, f);
    float acc[64];  // y - bias at the accumulator positions
    project(acc, h, dev::smem_addr(w_tile));
    store_out<Tout>(acc, a, m0, f);
  }
}

template <class Tout>
cudaError_t launch(const FwdArgs& a, cudaStream_t stream) {
  unsigned blocks = 0;
  if (cudaError_t e = grid_for(forward_kernel<Tout>, a.rows.count(), &blocks); e != cudaSuccess) return e;
  forward_kernel<Tout><<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t forward(const FwdArgs& a, cudaStream_t stream) {
  if (a.rows.count() == 0) return cudaSuccess;
  return a.out_dtype == DType::kFP32 ? launch<float>(a, stream) : launch<bf16>(a, stream);
}

}  // namespace tpf::gated
