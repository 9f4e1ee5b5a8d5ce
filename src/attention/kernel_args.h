// Device-side arguments of the attention kernels: raw pointers and 64-bit strides (in
// elements), built from validated TensorViews by attention_api.cpp. No CUDA types here.
#pragma once
#include <cstdint>

namespace tpf::attn {

// A [B,S,H,N,D] tensor whose head-dim stride is 1.
struct Bshnd {
  void* ptr = nullptr;
  int64_t sb = 0, ss = 0, sh = 0, sn = 0;
};

struct BiasRef {  // [B,1,H,N,N]
  void* ptr = nullptr;
  int64_t sb = 0, sh = 0, sq = 0, sk = 0;
  bool fp32 = false;    // else the activation dtype
  bool vec16 = false;   // key stride 1 and every row 16-byte aligned: tiles load with cp.async
};

struct MaskRef {  // [B,S,1,1,N] bool; ptr == nullptr: attend everywhere
  const uint8_t* ptr = nullptr;
  int64_t sb = 0, ss = 0, sk = 0;
};

struct Dims {
  int B = 0, S = 0, H = 0, N = 0;
};

struct FwdArgs {
  Bshnd q, k, v, out, res;  // res.ptr == nullptr: no compensation residual
  BiasRef bias;
  MaskRef mask;
  float* lse = nullptr;  // [B,S,H,N] contiguous
  Dims dims;
  float scale = 0;
};

struct BwdArgs {
  Bshnd q, k, v, out, res, dout, dq, dk, dv;
  BiasRef bias, dbias;  // dbias.ptr == nullptr: no bias gradient
  MaskRef mask;
  const float* lse = nullptr;  // [B,S,H,N]
  Dims dims;
  float scale = 0;
  // Workspace (see attention_api.cpp for the layout).
  float* dq_acc = nullptr;      // [chains][B,S,H,N,D] fp32, ordered sums over each chain's key tiles
  float* delta = nullptr;       // [B,S,H,N] Dlt = <dO, O (+ R)>: the caller's (delta_given) or the workspace's
  bool delta_given = false;
  float* lse_log2 = nullptr;    // [B,S,H,N] LSE * log2(e), so P = exp2(s * log2(e) - lse_log2)
  int* dq_turn = nullptr;       // [chains][B,H,slice groups,query tiles] whose key tile adds next
  int dq_chains = 1;            // key tile kb adds in chain kb % dq_chains, at place kb / dq_chains
  float* dbias_part = nullptr;  // [chunks,B,H,Nk,Nq] per-chunk partial sums, key-major, rows
                                //   padded to whole tiles (Nk, Nq) so tiles need no edge checks
  int chunks = 1;               // slice chunks (dbias partials)
  int groups_per_chunk = 1;     // slice groups of BwdConfig::kSlices per chunk
  int part_rows = 0, part_cols = 0;  // Nk = N rounded up to kBlockK, Nq = N rounded up to kBlockQ
};

}  // namespace tpf::attn
