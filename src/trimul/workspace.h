// Workspace layout of the multiplicative-update stages: one function lays the buffers out, for
// the size query (base == nullptr) and for the call, so the two cannot disagree.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "trimul/layout.h"
#include "trimul/tile_config.h"

namespace tpf::trimul {

// Split of the weight-gradient products over pixel rows: chunk rows (a multiple of the k-step)
// and the number of chunks, for an output of `rows x cols`.
struct WgradSplit {
  int64_t chunk, parts;
};
inline WgradSplit wgrad_split(int64_t M, int64_t rows, int64_t cols) {
  const int64_t tiles = ((rows + GemmConfig::kBlockM - 1) / GemmConfig::kBlockM) *
                        ((cols + GemmConfig::kBlockN - 1) / GemmConfig::kBlockN);
  const int64_t want = std::max<int64_t>(1, kWgradTargetBlocks / tiles);
  int64_t chunk = std::max<int64_t>(kWgradMinRows, (M + want - 1) / want);
  chunk = (chunk + GemmConfig::kBlockK - 1) / GemmConfig::kBlockK * GemmConfig::kBlockK;
  return {chunk, (M + chunk - 1) / chunk};
}

struct Workspace {
  // Both passes (types: the precision plan in kernels.h).
  void *wcat = nullptr, *wz = nullptr;          // fp16 folded weights [4Ch + C][C], [C][Ch]
  float *bcat = nullptr, *bz = nullptr;         // folded biases
  void* xhat_in = nullptr;                      // fp16 [M][C]  LayerNorm_in(z) without affine
  void *a = nullptr, *b = nullptr;              // channel-major, fp16 forward / bf16 backward
  void* gate = nullptr;                         // fp16 [M][C]  sigmoid / logit of the gate
  void* x = nullptr;                            // channel-major, bf16
  void* xhat_out = nullptr;                     // fp16 [M][Ch] (forward: aliases xhat_in)
  // Backward only.
  void *wcat_raw = nullptr, *wz_raw = nullptr;  // bf16 unfolded weights (wz_raw twice: [2C][Ch])
  void *xhat_in_bf = nullptr, *xhat_out_bf = nullptr;  // bf16 copies (weight-gradient operands)
  float *mean_in = nullptr, *rstd_in = nullptr, *mean_out = nullptr, *rstd_out = nullptr;  // [M]
  void* dy = nullptr;                           // [M][2C] bf16: dy's high parts, then its low parts
  void* dlin = nullptr;                         // [M][4Ch + C]
  float* dxhat = nullptr;                       // [M][max(C, Ch)] fp32: d xhat_out, then d xhat_in
  void* dx = nullptr;                           // channel-major bf16
  float *da = nullptr, *db = nullptr;           // channel-major fp32
  float *colsum_dy = nullptr, *colsum_lin = nullptr;  // [m-tiles][C], [m-tiles][4Ch + C]
  float *part_in = nullptr, *part_out = nullptr;      // weight-gradient partials
  float *g_in = nullptr, *g_out = nullptr, *s_in = nullptr, *s_out = nullptr;
  WgradSplit split_in{}, split_out{};
  size_t bytes = 0;
};

inline Workspace plan_workspace(const Dims& d, bool backward, void* base) {
  Workspace w;
  auto* p = static_cast<uint8_t*>(base);
  size_t off = 0;
  auto take = [&](int64_t elems, int64_t esize) -> void* {
    off = (off + 255) / 256 * 256;
    void* r = p ? p + off : nullptr;
    off += static_cast<size_t>(elems * esize);
    return r;
  };
  const int64_t M = d.M(), P = d.proj_cols(), mt = (M + GemmConfig::kBlockM - 1) / GemmConfig::kBlockM;
  w.wcat = take(P * d.C, 2);
  w.bcat = static_cast<float*>(take(P, 4));
  w.wz = take(d.C * d.Ch, 2);
  w.bz = static_cast<float*>(take(d.C, 4));
  if (!backward) {
    w.xhat_in = take(M * std::max(d.C, d.Ch), 2);
    w.xhat_out = w.xhat_in;  // xhat_in is dead once a, b and the gate exist
    w.a = take(d.cm_elems(), 2);
    w.b = take(d.cm_elems(), 2);
    w.gate = take(M * d.C, 2);
    w.x = take(d.cm_elems(), 2);
    w.bytes = off;
    return w;
  }
  w.xhat_in = take(M * d.C, 2);
  w.a = take(d.cm_elems(), 2);
  w.b = take(d.cm_elems(), 2);
  // Two regions hold buffers whose lives end before da and db begin (backward.cu's order):
  // the gate and xhat_out die in the output stage, x and d xhat_out in LayerNorm_out's
  // backward; da and db (fp32, written by the transposed products) then reuse the regions,
  // and d xhat_in reuses the second one's tail once db is consumed.
  const auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t cm4 = d.cm_elems() * 4, gate_bytes = aligned(M * d.C * 2),
                x_bytes = aligned(d.cm_elems() * 2);
  auto* r1 = static_cast<uint8_t*>(take(std::max(gate_bytes + M * d.Ch * 2, cm4), 1));
  auto* r2 = static_cast<uint8_t*>(take(std::max(x_bytes + M * std::max(d.C, d.Ch) * 4, cm4), 1));
  if (p) {
    w.gate = r1;
    w.xhat_out = r1 + gate_bytes;
    w.da = reinterpret_cast<float*>(r1);
    w.x = r2;
    w.dxhat = reinterpret_cast<float*>(r2 + x_bytes);
    w.db = reinterpret_cast<float*>(r2);
  }
  w.wcat_raw = take(P * d.C, 2);
  w.wz_raw = take(2 * d.C * d.Ch, 2);
  w.xhat_in_bf = take(M * d.C, 2);
  w.xhat_out_bf = take(M * d.Ch, 2);
  w.mean_in = static_cast<float*>(take(M, 4));
  w.rstd_in = static_cast<float*>(take(M, 4));
  w.mean_out = static_cast<float*>(take(M, 4));
  w.rstd_out = static_cast<float*>(take(M, 4));
  w.dy = take(M * 2 * d.C, 2);
  w.dlin = take(M * P, 2);
  w.dx = take(d.cm_elems(), 2);
  w.colsum_dy = static_cast<float*>(take(mt * d.C, 4));
  w.colsum_lin = static_cast<float*>(take(mt * P, 4));
  w.split_in = wgrad_split(M, P, d.C);
  w.split_out = wgrad_split(M, 2 * d.C, d.Ch);  // rows: dy's high then low parts
  w.part_in = static_cast<float*>(take(w.split_in.parts * P * d.C, 4));
  w.part_out = static_cast<float*>(take(w.split_out.parts * 2 * d.C * d.Ch, 4));
  w.g_in = static_cast<float*>(take(P * d.C, 4));
  w.g_out = static_cast<float*>(take(d.C * d.Ch, 4));
  w.s_in = static_cast<float*>(take(P, 4));
  w.s_out = static_cast<float*>(take(d.C, 4));
  w.bytes = off;
  return w;
}

}  // namespace tpf::trimul
