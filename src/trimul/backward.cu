// Backward sequence (precision plan in kernels.h): the forward's saved set (or its recompute up
// to LayerNorm_out when the caller kept none), then the output stage, LayerNorm_out backward,
// the two transposed triangle products, the input projection backward and LayerNorm_in
// backward (one fused kernel where tail.h applies); weight gradients as split-K products summed
// in order. Independent stages run on two streams (common/side_stream.h): d xhat_out with dWz,
// da with db, dW_in's two products (beside d xhat_in on the three-kernel path).
#include <cuda_bf16.h>

#include <algorithm>

#include "common/side_stream.h"
#include "trimul/norm_epilogue.cuh"
#include "trimul/stages.cuh"
#include "trimul/tail.h"

namespace tpf::trimul {
namespace {

using T = __nv_bfloat16;

// da and db from dx (outgoing: da = dx b, db = dxᵀ a; incoming: da = b dxᵀ, db = a dx), da on
// stream s, db on s_db.
cudaError_t triangle_backward(const Problem& p, const Workspace& ws, cudaStream_t s, cudaStream_t s_db) {
  const Dims& d = p.d;
  const GemmShape shape{d.N, static_cast<int>(d.Np), d.N, 0};
  const int batches = static_cast<int>(d.B * d.Ch);
  const Operand dx = channel_matrices(ws.dx, d), a = channel_matrices(ws.a_bf, d),
                b = channel_matrices(ws.b_bf, d);
  auto out = [&](float* ptr) { return StoreEpilogue<float>{ptr, d.Np, d.plane(), d.N, d.Np}; };
  cudaError_t e;
  if (p.outgoing) {
    if ((e = launch_product<T, Major::kK, Major::kMN>(dx, b, shape, batches, out(ws.da), s)) != cudaSuccess) return e;
    return launch_product<T, Major::kMN, Major::kMN>(dx, a, shape, batches, out(ws.db), s_db);
  }
  if ((e = launch_product<T, Major::kK, Major::kK>(b, dx, shape, batches, out(ws.da), s)) != cudaSuccess) return e;
  return launch_product<T, Major::kK, Major::kMN>(a, dx, shape, batches, out(ws.db), s_db);
}

// Pixel rows [r0, r1) of the backward: the whole of them, or a chunk of the tail.
struct PixelRange {
  int64_t r0, r1;
};

// G = dYᵀ X over the pixels of `px` (whole split-K chunks of `split`), as the fp32 partials of
// those chunks, numbered from px's first (K = pixels: a long-K product); dY's and X's rows are
// y_ld and x_ld apart (their first `rows` and `cols` columns are read), and their buffers start
// at pixel y_row0 / x_row0. The operands are addressed from px's first pixel, so that TMA reaches
// a chunk of the tail too: on the TMA loop with tiles spanning the wider output side
// (tile_config.h's Wgrad tiles), or on the wgmma loop where TMA cannot reach an operand.
cudaError_t weight_gradient(const void* dY, int64_t rows, int64_t y_ld, int64_t y_row0, const void* X, int64_t cols,
                            int64_t x_ld, int64_t x_row0, const WgradSplit& split, const PixelRange& px, float* part,
                            cudaStream_t s) {
  const int64_t K = px.r1 - px.r0;
  const Operand A{static_cast<const T*>(dY) + (px.r0 - y_row0) * y_ld, y_ld, 0, K, rows},
      B{static_cast<const T*>(X) + (px.r0 - x_row0) * x_ld, x_ld, 0, K, cols};
  const StoreEpilogue<float> epi{part, cols, rows * cols, rows, cols};
  const GemmShape shape{rows, static_cast<int>(cols), K, split.chunk};
  const int chunks = static_cast<int>((K + split.chunk - 1) / split.chunk);
  cudaError_t e = cudaSuccess;
  const bool tma = rows > 128 ? launch_wgrad_tma<WgradWideTile, T>(A, B, shape, chunks, epi, s, &e)
                              : launch_wgrad_tma<WgradNarrowTile, T>(A, B, shape, chunks, epi, s, &e);
  return tma ? e : launch_long_k<T, Major::kMN, Major::kMN>(A, B, shape, chunks, epi, s);
}

// d xhat_in's product with LayerNorm_in's backward in its epilogue, into dz (Tdz) plus dz_in.
template <class Tdz>
cudaError_t norm_in_backward(const Problem& p, const Workspace& ws, const Operand& dlin_rows, const Operand& wcat_n,
                             const GemmShape& shape, cudaStream_t s) {
  const NormRowsBackwardEpilogue<Tdz> fused{p.d, p.w.w[kNormInW], ws.mean_in, ws.rstd_in, p.z, p.dz, p.dz_in,
                                            ws.norm_in_part};
  return launch_long_k<T, Major::kK, Major::kMN>(dlin_rows, wcat_n, shape, 1, fused, s);
}

// The three-kernel path where the fused tail (tail.h) does not apply: the input projections'
// backward (p, g recomputed) into dlin's a/b columns, on mma.sync with its epilogue from registers.
cudaError_t project_backward(const Problem& p, const Workspace& ws, const PixelRange& px, cudaStream_t s) {
  const Dims& d = p.d;
  const ProjectBackwardEpilogue<T> pb{d, ws.bcat, p.mask, ws.da, ws.db, static_cast<T*>(ws.dlin), ws.colsum_lin,
                                      px.r0};
  const Operand xhat{ws.xhat_in, d.C, 0, px.r1, d.C, ws.xhat_row0};
  return launch_gemm<__half, Major::kK, Major::kK>(xhat, weight_rows(ws.wcat, 4 * d.Ch, d.C),
                                                   {px.r1, static_cast<int>(4 * d.Ch), d.C, 0, px.r0}, 1, pb, s);
}

// Then d xhat_in = (dlin wcat) * gamma_in with LayerNorm_in's backward into dz (dlin's gate
// columns in place).
cudaError_t dxhat_in_backward(const Problem& p, const Workspace& ws, const PixelRange& px, cudaStream_t s) {
  const Dims& d = p.d;
  const int64_t M = d.M(), PL = d.dlin_cols();
  // K = P + 4Ch: dlin's high parts against every row of Wcat, its a/b low parts against the a/b
  // rows again, so dlin's rounding does not reach dz.
  const Operand dlin_rows{ws.dlin, PL, 0, px.r1, PL, px.r0}, wcat_n{ws.wcat_raw, d.C, 0, PL, d.C};
  const GemmShape dxhat_in_shape{px.r1, static_cast<int>(d.C), PL, 0, px.r0};
  if (fused_norm_in(d))
    return p.dz_f32 ? norm_in_backward<float>(p, ws, dlin_rows, wcat_n, dxhat_in_shape, s)
                    : norm_in_backward<T>(p, ws, dlin_rows, wcat_n, dxhat_in_shape, s);
  // one chunk (workspace.h's tail_rows): the row kernel takes every pixel
  const StoreEpilogue<float> to_dxhat_in{ws.dxhat, d.C, 0, M, d.C, p.w.w[kNormInW]};
  cudaError_t e = launch_gemm<T, Major::kK, Major::kMN>(dlin_rows, wcat_n, dxhat_in_shape, 1, to_dxhat_in, s);
  return e != cudaSuccess ? e : ln_rows_backward(p, ws.dxhat, ws.mean_in, ws.rstd_in, s);
}

// The tail over pixel rows px: the input projections' backward, d xhat_in and LayerNorm_in's
// backward (one fused kernel, or the three-kernel path), and beside them dW_in's partials of the
// chunk's pixels, then their sums added to g_in and g_in_lo (the chunks' running totals, in chunk
// order). dlin's rows are px's (row px.r0 first); its gate columns come from dgate when dlin
// holds a chunk.
cudaError_t backward_tail(const Problem& p, const Workspace& ws, const PixelRange& px, cudaStream_t s) {
  const Dims& d = p.d;
  const int64_t P = d.proj_cols(), PL = d.dlin_cols();
  const bool fused = fused_tail_ok(d);
  cudaError_t e = fused ? fused_tail(p, ws, px.r0, px.r1, s) : project_backward(p, ws, px, s);
  if (e != cudaSuccess) return e;
  if (ws.dgate &&
      (e = cudaMemcpy2DAsync(static_cast<T*>(ws.dlin) + 4 * d.Ch, PL * sizeof(T),
                             static_cast<const T*>(ws.dgate) + px.r0 * d.C, d.C * sizeof(T), d.C * sizeof(T),
                             static_cast<size_t>(px.r1 - px.r0), cudaMemcpyDeviceToDevice, s)) != cudaSuccess)
    return e;
  tpf::detail::Fork fork(s);
  if ((e = fork.begin()) != cudaSuccess) return e;
  if (!fused && (e = dxhat_in_backward(p, ws, px, s)) != cudaSuccess) return e;
  // dW_inᵀ from xhat_in's high rows then low rows against dlin (the [2C][P] partials stack the
  // two), and xhat_in's high rows against dlin's a/b low parts: neither xhat_in's nor dlin's
  // bf16 rounding reaches the input-side weight gradients (the low x low product is below both).
  const T* dlin = static_cast<const T*>(ws.dlin);
  if ((e = weight_gradient(ws.xhat_in_bf, 2 * d.C, 2 * d.C, ws.xhat_row0, dlin, P, PL, px.r0, ws.split_in, px,
                           ws.part_in, fork.side())) != cudaSuccess ||
      (e = weight_gradient(ws.xhat_in_bf, d.C, 2 * d.C, ws.xhat_row0, dlin + P, 4 * d.Ch, PL, px.r0, ws.split_in_lo, px,
                           ws.part_in_lo, s)) != cudaSuccess ||
      (e = fork.join()) != cudaSuccess)
    return e;
  const int64_t parts = (px.r1 - px.r0 + ws.split_in.chunk - 1) / ws.split_in.chunk;
  const bool add = px.r0 > 0;
  if ((e = sum_partials(ws.part_in, d.C * P, 2 * parts, ws.g_in, s, add)) != cudaSuccess) return e;
  return sum_partials(ws.part_in_lo, d.C * 4 * d.Ch, parts, ws.g_in_lo, s, add);
}

}  // namespace

cudaError_t run_backward(const Problem& p, const Workspace& ws, bool recompute, cudaStream_t s) {
  const Dims& d = p.d;
  const int64_t M = d.M(), P = d.proj_cols(), mt = (M + Cfg::kBlockM - 1) / Cfg::kBlockM;
  cudaError_t e = recompute ? forward_through_product<T>(p, ws, s)
                            : prep_weights(p, ws.wcat, ws.bcat, ws.wz, ws.bz, ws.wcat_raw, ws.wz_raw, s);
  if (e != cudaSuccess) return e;
  // Output stage: dy, the gate-logit gradient and their column sums.
  // The gate logit's gradient: dlin's gate columns, or dgate when dlin holds a chunk of the tail.
  T* dgate = ws.dgate ? static_cast<T*>(ws.dgate) : static_cast<T*>(ws.dlin) + 4 * d.Ch;
  const OutGradEpilogue<T> og{d, ws.bz, static_cast<const __half*>(ws.logit), p.dout, static_cast<T*>(ws.dy),
                              dgate, ws.dgate ? d.C : d.dlin_cols(), ws.colsum_dy, ws.colsum_lin};
  if ((e = launch_gemm<__half, Major::kK, Major::kK>(pixel_rows(ws.xhat_out, d, d.Ch), weight_rows(ws.wz, d.C, d.Ch),
                                                {M, static_cast<int>(d.C), d.Ch, 0}, 1, og, s)) != cudaSuccess)
    return e;
  // d xhat_out = (dy Wz) * gamma_out (Wz [C][Ch] read N-major; K = 2C: dy's high and low parts
  // against Wz twice), then LayerNorm_out backward into dx: in the product's epilogue where a
  // tile holds whole rows (norm_epilogue.cuh), else by a row kernel. Beside it dWz from dy's
  // high rows then low rows (each chunk's [2C][Ch] partial is two [C][Ch] parts).
  tpf::detail::Fork fork(s);
  if ((e = fork.begin()) != cudaSuccess) return e;
  const Operand dy_rows = pixel_rows(ws.dy, d, 2 * d.C), wz_n = Operand{ws.wz_raw, d.Ch, 0, 2 * d.C, d.Ch};
  const GemmShape dxhat_out_shape{M, static_cast<int>(d.Ch), 2 * d.C, 0};
  if (fused_norm_out(d)) {
    const NormChannelMajorBackwardEpilogue fused{d, p.w.w[kNormOutW], ws.mean_out, ws.rstd_out,
                                                 static_cast<const T*>(ws.x), static_cast<T*>(ws.dx),
                                                 ws.norm_out_part};
    if ((e = launch_long_k<T, Major::kK, Major::kMN>(dy_rows, wz_n, dxhat_out_shape, 1, fused, s)) != cudaSuccess) return e;
  } else {
    const StoreEpilogue<float> to_dxhat_out{ws.dxhat, d.Ch, 0, M, d.Ch, p.w.w[kNormOutW]};
    if ((e = launch_gemm<T, Major::kK, Major::kMN>(dy_rows, wz_n, dxhat_out_shape, 1, to_dxhat_out, s)) != cudaSuccess ||
        (e = ln_channel_major_backward(p, ws.dxhat, ws.x, ws.mean_out, ws.rstd_out, ws.dx, s)) != cudaSuccess)
      return e;
  }
  if ((e = weight_gradient(ws.dy, 2 * d.C, 2 * d.C, 0, ws.xhat_out_bf, d.Ch, d.Ch, 0, ws.split_out, {0, M},
                           ws.part_out, fork.side())) != cudaSuccess ||
      (e = fork.join()) != cudaSuccess)
    return e;
  // dy is dead: db may take its region (and da d xhat's).
  if ((e = fork.begin()) != cudaSuccess || (e = triangle_backward(p, ws, s, fork.side())) != cudaSuccess ||
      (e = fork.join()) != cudaSuccess)
    return e;
  for (int64_t r0 = 0; r0 < M; r0 += ws.tail_rows) {
    const PixelRange px{r0, std::min(M, r0 + ws.tail_rows)};
    if (!ws.xhat_per_chunk) {
      if ((e = backward_tail(p, ws, px, s)) != cudaSuccess) return e;
      continue;
    }
    // the recomputing backward's overlays (workspace.h): x̂_in's copies of the chunk's rows
    Workspace chunk = ws;
    chunk.xhat_in = ws.tail_xhat, chunk.xhat_in_bf = ws.tail_xhat_bf, chunk.xhat_row0 = px.r0;
    if ((e = ln_rows_forward(p, chunk.xhat_in, chunk.xhat_in_bf, nullptr, nullptr, s, px.r0, px.r1)) != cudaSuccess ||
        (e = backward_tail(p, chunk, px, s)) != cudaSuccess)
      return e;
  }
  if ((e = sum_partials(ws.part_out, d.C * d.Ch, 2 * ws.split_out.parts, ws.g_out, s)) != cudaSuccess) return e;
  if ((e = sum_partials(ws.colsum_lin, P, mt, ws.s_in, s)) != cudaSuccess) return e;
  if ((e = sum_partials(ws.colsum_dy, d.C, mt, ws.s_out, s)) != cudaSuccess) return e;
  const bool in_fused = fused_norm_in(d), out_fused = fused_norm_out(d);
  if ((in_fused && (e = sum_partials(ws.norm_in_part, 2 * d.C, mt, ws.norm_in, s)) != cudaSuccess) ||
      (out_fused && (e = sum_partials(ws.norm_out_part, 2 * d.Ch, mt, ws.norm_out, s)) != cudaSuccess))
    return e;
  return finalize_weight_grads(p, ws.g_in, ws.g_in_lo, ws.s_in, ws.g_out, ws.s_out, in_fused ? ws.norm_in : nullptr,
                               out_fused ? ws.norm_out : nullptr, s);
}

}  // namespace tpf::trimul
