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
inline WgradSplit wgrad_split(int64_t M, int64_t rows, int64_t cols, int64_t min_rows = kWgradMinRows) {
  const int64_t tiles = ((rows + GemmConfig::kBlockM - 1) / GemmConfig::kBlockM) *
                        ((cols + GemmConfig::kBlockN - 1) / GemmConfig::kBlockN);
  const int64_t want = std::max<int64_t>(1, kWgradTargetBlocks / tiles);
  int64_t chunk = std::max<int64_t>(min_rows, (M + want - 1) / want);
  // a whole number of k-steps and of output row tiles (a pixel chunk of the backward's tail
  // starts on a row tile: workspace.h's tail_rows)
  static_assert(GemmConfig::kBlockM % GemmConfig::kBlockK == 0, "row tiles hold whole k-steps");
  chunk = (chunk + GemmConfig::kBlockM - 1) / GemmConfig::kBlockM * GemmConfig::kBlockM;
  return {chunk, (M + chunk - 1) / chunk};
}

// Where the LayerNorm backwards run in their products' epilogues (backward.cu): one tile holds a
// whole row, and (channel-major) 8-pixel groups stay inside a matrix row. Both: no fp32 d x̂
// buffer.
inline bool fused_norm_in(const Dims& d) { return d.C <= GemmConfig::kBlockN; }
inline bool fused_norm_out(const Dims& d) { return d.Ch <= GemmConfig::kBlockN && d.N % 8 == 0; }

// Pixel rows of one chunk of the low-memory backward's tail (kTailChunks, whole split-K chunks
// of dW_in), or M: one chunk. The tail is chunked where LayerNorm_in's backward runs in the
// d xhat_in product's epilogue (C <= one tile), since the row kernel's fp32 d xhat aliases da.
inline int64_t tail_rows(const Dims& d, const WgradSplit& split_in) {
  if (!fused_norm_in(d)) return d.M();
  const int64_t per = (split_in.parts + kTailChunks - 1) / kTailChunks;
  return std::min(d.M(), per * split_in.chunk);
}

// Bytes between buffers that no kernel writes (alignment padding).
struct Gap {
  void* ptr;
  size_t bytes;
};
constexpr int kMaxSavedGaps = 16;

struct Workspace {
  // Both passes (types: the precision plan in kernels.h).
  void *wcat = nullptr, *wz = nullptr;          // fp16 folded weights [4Ch + C][C], [C][Ch]
  float *bcat = nullptr, *bz = nullptr;         // folded biases
  void *a = nullptr, *b = nullptr;              // fp16 channel-major: the forward's product operands
  void* gate = nullptr;                         // fp16 [M][C] sigmoid of the gate (forward)
  // The saved set: what the backward needs from the forward. The backward reads it from the
  // caller's `saved` buffer (written by a forward that saved) or recomputes it into its own
  // workspace; the forward writes it only when asked to save (else only xhat_in, x, xhat_out,
  // with xhat_out aliasing xhat_in).
  void* xhat_in = nullptr;                      // fp16 [M][C]  LayerNorm_in(z) without affine
  void* xhat_in_bf = nullptr;                   // bf16 [M][2C] high | low parts (weight-gradient operand)
  float *mean_in = nullptr, *rstd_in = nullptr; // [M]
  void *a_bf = nullptr, *b_bf = nullptr;        // bf16 channel-major: the backward's product operands
  void* logit = nullptr;                        // fp16 [M][C]  gate logit
  void* x = nullptr;                            // bf16 channel-major: the triangle product
  void* xhat_out = nullptr;                     // fp16 [M][Ch]
  void* xhat_out_bf = nullptr;                  // bf16 copy (weight-gradient operand)
  float *mean_out = nullptr, *rstd_out = nullptr;  // [M]
  // Backward only.
  void *wcat_raw = nullptr, *wz_raw = nullptr;  // bf16 unfolded weights ([P + 4Ch][C], [2C][Ch]: kernels.h)
  void* dy = nullptr;                           // [M][2C] bf16: dy's high parts, then its low parts
  // dlin [tail_rows][P + 4Ch]: all P = 4Ch + C columns, then the a/b columns' low parts; dgate
  // [M][C]: the gate columns for every pixel, when dlin holds a chunk of the tail (else null)
  void *dlin = nullptr, *dgate = nullptr;
  int64_t tail_rows = 0;                        // pixel rows of dlin: a chunk of the backward's tail, or M
  int64_t tail_parts = 0;  // dW_in's split-K chunks in a tail chunk: its partials, summed into g_in after each
  // The recomputing backward's layout (plan_recompute): x̂_in's copies for the tail
  // remade per chunk of tail_rows pixels into tail_xhat ([tail_rows][C] fp16) and tail_xhat_bf
  // ([tail_rows][2C]); xhat_row0: the pixel of xhat_in's and xhat_in_bf's row 0 as the tail reads
  // them (0, or the chunk's first pixel).
  bool xhat_per_chunk = false;
  void *tail_xhat = nullptr, *tail_xhat_bf = nullptr;
  int64_t xhat_row0 = 0;
  float* dxhat = nullptr;                       // [M][max(C, Ch)] fp32: d xhat_out, then d xhat_in
  void* dx = nullptr;                           // channel-major bf16
  float *da = nullptr, *db = nullptr;           // channel-major fp32
  float *colsum_dy = nullptr, *colsum_lin = nullptr;  // [m-tiles][C], [m-tiles][4Ch + C]
  float *part_in = nullptr, *part_in_lo = nullptr, *part_out = nullptr;  // weight-gradient partials
  float *g_in = nullptr, *g_in_lo = nullptr, *g_out = nullptr, *s_in = nullptr, *s_out = nullptr;
  float *norm_in_part = nullptr, *norm_out_part = nullptr;  // [m-tiles][2C], [m-tiles][2Ch]
  float *norm_in = nullptr, *norm_out = nullptr;            // [2C], [2Ch]: d gamma | d beta
  WgradSplit split_in{}, split_in_lo{}, split_out{};
  size_t bytes = 0;        // of the workspace
  size_t saved_bytes = 0;  // of the saved set
  int saved_gaps = 0;      // a saving forward's padding in the saved set (zeroed by the forward)
  Gap saved_gap[kMaxSavedGaps] = {};
};

// Bump allocation of 256-byte aligned buffers from `base` (sizing only when base == nullptr).
// Records the alignment gaps it leaves (up to kMaxSavedGaps; used for the saved set, a tensor
// the caller sees: its gaps are zeroed so that it is bitwise deterministic too).
class Arena {
 public:
  explicit Arena(void* base) : p_(static_cast<uint8_t*>(base)) {}
  void* take(int64_t elems, int64_t esize) {
    align();
    void* r = p_ ? p_ + off_ : nullptr;
    off_ += static_cast<size_t>(elems * esize);
    return r;
  }
  float* take_f32(int64_t elems) { return static_cast<float*>(take(elems, 4)); }
  // Ends on a 256-byte boundary (the padding becomes a gap).
  void align() {
    const size_t next = (off_ + 255) / 256 * 256;
    if (next > off_ && p_ && gaps_ < kMaxSavedGaps) gap_[gaps_++] = {p_ + off_, next - off_};
    off_ = next;
  }
  size_t bytes() const { return (off_ + 255) / 256 * 256; }
  int gaps() const { return gaps_; }
  const Gap& gap(int i) const { return gap_[i]; }

 private:
  uint8_t* p_;
  size_t off_ = 0;
  Gap gap_[kMaxSavedGaps] = {};
  int gaps_ = 0;
};

// The saved set's layout (one function for the size query, the forward and the backward).
inline size_t plan_saved(const Dims& d, Arena& a, Workspace& w) {
  const int64_t M = d.M();
  const size_t start = a.bytes();
  w.xhat_in = a.take(M * d.C, 2);
  w.xhat_in_bf = a.take(M * 2 * d.C, 2);
  w.mean_in = a.take_f32(M);
  w.rstd_in = a.take_f32(M);
  w.a_bf = a.take(d.cm_elems(), 2);
  w.b_bf = a.take(d.cm_elems(), 2);
  w.logit = a.take(M * d.C, 2);
  w.x = a.take(d.cm_elems(), 2);
  w.xhat_out = a.take(M * d.Ch, 2);
  w.xhat_out_bf = a.take(M * d.Ch, 2);
  w.mean_out = a.take_f32(M);
  w.rstd_out = a.take_f32(M);
  a.align();
  return a.bytes() - start;
}

inline size_t saved_size(const Dims& d) {
  Arena a(nullptr);
  Workspace w;
  return plan_saved(d, a, w);
}

// Forward workspace; with `save` the saved set goes to `saved` (nullptr when only sizing).
inline Workspace plan_forward(const Dims& d, void* base, bool save, void* saved) {
  Workspace w;
  Arena a(base);
  const int64_t M = d.M();
  w.wcat = a.take(d.proj_cols() * d.C, 2);
  w.bcat = a.take_f32(d.proj_cols());
  w.wz = a.take(d.C * d.Ch, 2);
  w.bz = a.take_f32(d.C);
  w.a = a.take(d.cm_elems(), 2);
  w.b = a.take(d.cm_elems(), 2);
  w.gate = a.take(M * d.C, 2);
  if (save) {
    Arena sa(saved);
    w.saved_bytes = plan_saved(d, sa, w);
    w.saved_gaps = sa.gaps();
    for (int i = 0; i < sa.gaps(); ++i) w.saved_gap[i] = sa.gap(i);
  } else {
    w.xhat_in = a.take(M * std::max(d.C, d.Ch), 2);
    w.xhat_out = w.xhat_in;  // xhat_in is dead once a, b and the gate exist
    w.x = a.take(d.cm_elems(), 2);
  }
  w.bytes = a.bytes();
  return w;
}

// The recomputing backward's layout: with both LayerNorm backwards in epilogues (no d x̂ buffer)
// it holds no saved set, only four regions whose buffers follow one another as their lives end,
// plus the statistics and the partials. backward.cu's order: 0 LayerNorm_in, 1 the projection,
// 2 the triangle product, 3 LayerNorm_out (0-3: the forward recomputed), 4 the output stage,
// 5 d x̂_out ‖ dWz, 6 da ‖ db, 7 per tail chunk: LayerNorm_in of the chunk, tail ‖ dW_in.
//   R1: x̂_in (0-1), then x (2-5) | x̂_out's bf16 copy (3-5); da (6-7) over both
//   R2: a_bf | b_bf (1-6) | x̂_out (3-4), then dx (5-6); the tail chunk's dlin and x̂_in copies (7)
//   R3: dy (4-5), then db (6-7)
//   R4: the gate logit (1-4), its gradient (4-7) in place: the output stage reads each logit
//       before it writes the gradient at the same place
// At C = Ch and N % 8 == 0 that is 2064 bytes a pair against the saved set's 2320 (the output
// stage, which holds a_bf, b_bf, x, x̂_out and its copy, the logit and dy at once, sets it).
// The tail's chunk is the most whole split-K chunks of dW_in that fit R2. False (nothing taken)
// where a LayerNorm backward needs its d x̂ buffer or no chunk fits.
inline bool plan_recompute(const Dims& d, Arena& a, Workspace& w) {
  if (!fused_norm_in(d) || !fused_norm_out(d)) return false;
  const auto r256 = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t M = d.M(), cm = d.cm_elems(), row_c = d.C * 2;  // bytes of an fp16 row of C
  const int64_t xi = r256(std::max(M * row_c, cm * 2)), xob = r256(std::max(M * d.Ch * 2, cm * 4 - xi));
  const int64_t ab = r256(cm * 2), xo = r256(std::max(M * d.Ch * 2, cm * 2)), r2 = 2 * ab + xo;
  const int64_t row_bytes = d.dlin_cols() * 2 + 3 * row_c;  // dlin, x̂_in fp16 and its bf16 pair
  const int64_t rows = std::min(M, std::max<int64_t>(0, (r2 - 512) / row_bytes) / w.split_in.chunk * w.split_in.chunk);
  if (rows == 0) return false;
  auto* p1 = static_cast<uint8_t*>(a.take(xi + xob, 1));
  auto* p2 = static_cast<uint8_t*>(a.take(r2, 1));
  auto at = [](uint8_t* base, int64_t off) { return base ? static_cast<void*>(base + off) : nullptr; };
  w.xhat_in = w.x = p1;
  w.xhat_out_bf = at(p1, xi);
  w.da = static_cast<float*>(w.xhat_in);
  w.a_bf = p2;
  w.b_bf = at(p2, ab);
  w.xhat_out = w.dx = at(p2, 2 * ab);
  w.dlin = p2;
  w.tail_xhat = at(p2, r256(rows * d.dlin_cols() * 2));
  w.tail_xhat_bf = at(p2, r256(rows * d.dlin_cols() * 2) + r256(rows * row_c));
  w.dy = a.take(std::max(M * 2 * row_c, cm * 4), 1);
  w.db = static_cast<float*>(w.dy);
  w.logit = w.dgate = a.take(M * row_c, 1);
  w.mean_in = a.take_f32(M);
  w.rstd_in = a.take_f32(M);
  w.mean_out = a.take_f32(M);
  w.rstd_out = a.take_f32(M);
  w.xhat_in_bf = w.dxhat = nullptr;  // x̂_in's pair per tail chunk; no d x̂
  w.tail_rows = rows;
  w.xhat_per_chunk = true;
  return true;
}

// Backward workspace; with `from_saved` the saved set is read from `saved` (nullptr when only
// sizing), else recomputed into the workspace.
inline Workspace plan_backward(const Dims& d, void* base, bool from_saved, void* saved) {
  Workspace w;
  Arena a(base);
  const int64_t M = d.M(), P = d.proj_cols(), mt = (M + GemmConfig::kBlockM - 1) / GemmConfig::kBlockM;
  w.wcat = a.take(P * d.C, 2);
  w.bcat = a.take_f32(P);
  w.wz = a.take(d.C * d.Ch, 2);
  w.bz = a.take_f32(d.C);
  w.wcat_raw = a.take((P + 4 * d.Ch) * d.C, 2);
  w.wz_raw = a.take(2 * d.C * d.Ch, 2);
  w.split_in = wgrad_split(M, 2 * d.C, P);  // rows: xhat_in's high then low parts
  w.split_in_lo = w.split_in;  // xhat_in's high parts x dlin's a/b low parts, on the same chunks
  if (from_saved) {
    Arena sa(saved);
    w.saved_bytes = plan_saved(d, sa, w);
  }
  if (from_saved || !plan_recompute(d, a, w)) {
    if (!from_saved) w.saved_bytes = plan_saved(d, a, w);  // the saved set, recomputed in place
    // Two regions each hold a buffer whose life ends before da or db begins (backward.cu's
    // order): d xhat_out is consumed by LayerNorm_out's backward before the transposed products
    // write da, and d xhat_in is written after the projection backward consumed da; dy's last
    // reader (dWz) runs before db is written.
    const int64_t cm4 = d.cm_elems() * 4;
    void* r1 = a.take(std::max(M * std::max(d.C, d.Ch) * 4, cm4), 1);
    void* r2 = a.take(std::max(M * 2 * d.C * 2, cm4), 1);
    w.dxhat = static_cast<float*>(r1);
    w.da = static_cast<float*>(r1);
    w.dy = r2;
    w.db = static_cast<float*>(r2);
    // Chunked in the low-memory mode (no saved set: the backward recomputes the forward), whole
    // when the forward saved: the chunks cost time (docs/perf-notes.md, 2026-12-04).
    w.tail_rows = from_saved ? M : tail_rows(d, w.split_in);
    w.dlin = a.take(w.tail_rows * d.dlin_cols(), 2);
    if (w.tail_rows < M) w.dgate = a.take(M * d.C, 2);
    w.dx = a.take(d.cm_elems(), 2);
  }
  w.colsum_dy = a.take_f32(mt * d.C);
  w.colsum_lin = a.take_f32(mt * P);
  // rows: dy's high then low parts
  w.split_out = wgrad_split(M, 2 * d.C, d.Ch, from_saved ? kWgradMinRows : kWgradMinRowsLowMemory);
  // dW_in's partials for one tail chunk at a time (all of them where the tail is one chunk)
  w.tail_parts = (w.tail_rows + w.split_in.chunk - 1) / w.split_in.chunk;
  w.part_in = a.take_f32(w.tail_parts * 2 * d.C * P);
  w.part_in_lo = a.take_f32(w.tail_parts * d.C * 4 * d.Ch);
  w.part_out = a.take_f32(w.split_out.parts * 2 * d.C * d.Ch);
  w.g_in = a.take_f32(P * d.C);
  w.g_in_lo = a.take_f32(4 * d.Ch * d.C);
  w.g_out = a.take_f32(d.C * d.Ch);
  w.s_in = a.take_f32(P);
  w.s_out = a.take_f32(d.C);
  w.norm_in_part = a.take_f32(mt * 2 * d.C);
  w.norm_out_part = a.take_f32(mt * 2 * d.Ch);
  w.norm_in = a.take_f32(2 * d.C);
  w.norm_out = a.take_f32(2 * d.Ch);
  w.bytes = a.bytes();
  return w;
}

}  // namespace tpf::trimul
