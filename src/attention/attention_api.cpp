// Triangle attention CUDA entry points: validate every argument, then build the kernels'
// argument structs and launch. Nothing is launched (or written) unless all checks pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention/kernels.h"
#include "common/cuda_check.h"
#include "turbopairformer/attention.h"

namespace tpf {
namespace {

attn::Bshnd bshnd(const TensorView& t) {
  attn::Bshnd r;
  r.ptr = t.data;
  r.sb = t.stride[0];
  r.ss = t.stride[1];
  r.sh = t.stride[2];
  r.sn = t.stride[3];
  return r;
}

attn::BiasRef bias_ref(const TensorView& t) {
  attn::BiasRef r;
  r.ptr = t.data;
  if (t.data) {
    r.sb = t.stride[0];
    r.sh = t.stride[2];
    r.sq = t.stride[3];
    r.sk = t.stride[4];
    r.fp32 = t.dtype == DType::kFP32;
    const int64_t elems16 = 16 / dtype_size(t.dtype);
    r.vec16 = r.sk == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && r.sq % elems16 == 0 &&
              r.sh % elems16 == 0 && r.sb % elems16 == 0;
  }
  return r;
}

attn::MaskRef mask_ref(const TensorView& t) {
  attn::MaskRef r;
  r.ptr = static_cast<const uint8_t*>(t.data);
  if (t.data) {
    r.sb = t.stride[0];
    r.ss = t.stride[1];
    r.sk = t.stride[4];
  }
  return r;
}

attn::Dims dims_of(const TensorView& q) {
  return {static_cast<int>(q.shape[0]), static_cast<int>(q.shape[1]),
          static_cast<int>(q.shape[2]), static_cast<int>(q.shape[3])};
}

double scale_of(const std::optional<double>& scale, int64_t D) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
}

// Launch-grid limits of the CUDA kernels (grid.z = B*H, int32 indices of B, S, H, N).
Status check_grid(const char* op, const TensorView& q) {
  if (q.shape[0] * q.shape[2] > 65535 || q.shape[1] > 65535 || q.shape[3] > (int64_t{1} << 30))
    return Status(StatusCode::kUnsupported,
                  std::string("tpf.") + op + ": argument 'q': B*H and S must be <= 65535 and "
                                             "N <= 2^30 for the CUDA kernels");
  return Status::Ok();
}

// The kernels index within one (b, s, h) slice (and within one bias plane) in 32 bits,
// including the rows of a last partial tile past N (up to 127 of them), whose copies read
// nothing but whose offsets are still computed.
Status check_slice_extent(const char* op, std::initializer_list<std::pair<const char*, const TensorView*>> ts) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  constexpr int64_t kTileRowPad = 127;
  for (const auto& [name, t] : ts) {
    if (!t->present()) continue;
    const int r = t->rank;
    const int64_t extent = (t->shape[r - 2] - 1 + kTileRowPad) * t->stride[r - 2] +
                           (t->shape[r - 1] - 1) * t->stride[r - 1] + 1;
    if (extent > kMax)
      return Status(StatusCode::kUnsupported,
                    std::string("tpf.") + op + ": argument '" + name +
                        "': one slice spans more than 2^31 elements; use a more compact layout");
  }
  return Status::Ok();
}

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Workspace of the backward: [dq_acc][delta][lse_log2][dq_turn][dbias_part], 256-byte aligned.
// At D = 32 each region is the larger of backward.cu's and the two-pass backward's (two_pass.cu),
// since which one runs depends on the tensors' strides and alignment (TMA), not only on shapes.
struct BwdWorkspace {
  size_t dq_acc, delta, lse_log2, turn, dbias_part, total;
};

BwdWorkspace workspace_layout(const AttentionBackwardParams& p, const attn::BwdPlan& plan) {
  const int64_t B = p.q.shape[0], S = p.q.shape[1], H = p.q.shape[2], N = p.q.shape[3],
                D = p.q.shape[4];
  int64_t turns = int64_t{plan.dq_chains} * B * H * plan.slice_groups * plan.query_tiles;
  int64_t parts = int64_t{plan.chunks} * B * H * plan.part_rows * plan.part_cols;
  if (D == 32) {
    const attn::TwoPassPlan tp = attn::plan_two_pass(dims_of(p.q));
    turns = std::max<int64_t>(turns, B * H * S * tp.key_tiles * 2);  // per query half
    parts = std::max<int64_t>(parts, int64_t{tp.chunks2} * B * H * tp.n_pad * tp.n_pad);
  }
  BwdWorkspace w;
  w.dq_acc = 0;
  w.delta = align_up(w.dq_acc + sizeof(float) * plan.dq_chains * B * S * H * N * D);
  w.lse_log2 = align_up(w.delta + sizeof(float) * B * S * H * N);
  w.turn = align_up(w.lse_log2 + sizeof(float) * B * S * H * N);
  w.dbias_part = align_up(w.turn + sizeof(int) * turns);
  w.total = w.dbias_part;
  if (p.dbias.present()) w.total = align_up(w.total + sizeof(float) * parts);
  return w;
}

}  // namespace

Status attention_forward(const AttentionForwardParams& p, cudaStream_t stream) {
  TPF_RETURN_IF_ERROR(validate_attention_forward(p, /*for_gpu=*/true));
  TPF_RETURN_IF_ERROR(check_grid("attention_forward", p.q));
  TPF_RETURN_IF_ERROR(check_slice_extent("attention_forward", {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"bias", &p.bias}}));
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      "attention_forward", stream, {{"q", p.q.data}, {"k", p.k.data}, {"v", p.v.data},
                            {"bias", p.bias.data}, {"mask", p.mask.data}, {"out", p.out.data},
                            {"out_residual", p.compensate ? p.out_residual.data : nullptr},
                            {"lse", p.lse.data}}));
  attn::FwdArgs a;
  a.q = bshnd(p.q);
  a.k = bshnd(p.k);
  a.v = bshnd(p.v);
  a.out = bshnd(p.out);
  if (p.compensate) a.res = bshnd(p.out_residual);
  a.bias = bias_ref(p.bias);
  a.mask = mask_ref(p.mask);
  a.lse = static_cast<float*>(p.lse.data);
  a.dims = dims_of(p.q);
  a.scale = static_cast<float>(scale_of(p.scale, p.q.shape[4]));
  return detail::cuda_status("attention_forward",
                             attn::launch_forward(a, p.q.dtype == DType::kFP16,
                                                  static_cast<int>(p.q.shape[4]), stream));
}

Status attention_backward_workspace_size(const AttentionBackwardParams& p, size_t* bytes) {
  TPF_RETURN_IF_ERROR(validate_attention_backward(p, /*for_gpu=*/true));
  const auto plan = attn::plan_backward(dims_of(p.q), static_cast<int>(p.q.shape[4]));
  *bytes = workspace_layout(p, plan).total;
  return Status::Ok();
}

Status attention_backward(const AttentionBackwardParams& p, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  TPF_RETURN_IF_ERROR(validate_attention_backward(p, /*for_gpu=*/true));
  TPF_RETURN_IF_ERROR(check_grid("attention_backward", p.q));
  TPF_RETURN_IF_ERROR(check_slice_extent("attention_backward", {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"dout", &p.dout}, {"bias", &p.bias}}));
  const auto plan = attn::plan_backward(dims_of(p.q), static_cast<int>(p.q.shape[4]));
  const BwdWorkspace w = workspace_layout(p, plan);
  if (workspace_bytes < w.total || (w.total > 0 && workspace == nullptr))
    return Status(StatusCode::kWorkspaceTooSmall,
                  "tpf.attention_backward: argument 'workspace': needs " + std::to_string(w.total) +
                      " bytes (attention_backward_workspace_size), got " +
                      std::to_string(workspace_bytes));
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0)
    return Status(StatusCode::kInvalidArgument,
                  "tpf.attention_backward: argument 'workspace': must be 256-byte aligned");
  TPF_RETURN_IF_ERROR(detail::check_device_pointers(
      "attention_backward", stream,
      {{"q", p.q.data}, {"k", p.k.data}, {"v", p.v.data}, {"bias", p.bias.data},
       {"mask", p.mask.data}, {"out", p.out.data},
       {"out_residual", p.compensate ? p.out_residual.data : nullptr}, {"lse", p.lse.data},
       {"dout", p.dout.data}, {"dq", p.dq.data}, {"dk", p.dk.data}, {"dv", p.dv.data},
       {"dbias", p.dbias.data}, {"delta", p.delta.data}, {"workspace", workspace}}));

  attn::BwdArgs a;
  a.q = bshnd(p.q);
  a.k = bshnd(p.k);
  a.v = bshnd(p.v);
  a.out = bshnd(p.out);
  if (p.compensate) a.res = bshnd(p.out_residual);
  a.dout = bshnd(p.dout);
  a.dq = bshnd(p.dq);
  a.dk = bshnd(p.dk);
  a.dv = bshnd(p.dv);
  a.bias = bias_ref(p.bias);
  a.dbias = bias_ref(p.dbias);
  a.mask = mask_ref(p.mask);
  a.lse = static_cast<const float*>(p.lse.data);
  a.dims = dims_of(p.q);
  const double scale = scale_of(p.scale, p.q.shape[4]);
  a.scale = static_cast<float>(scale);
  auto* ws = static_cast<char*>(workspace);
  a.dq_acc = reinterpret_cast<float*>(ws + w.dq_acc);
  a.delta_given = p.delta.present();
  a.delta = a.delta_given ? static_cast<float*>(p.delta.data) : reinterpret_cast<float*>(ws + w.delta);
  a.lse_log2 = reinterpret_cast<float*>(ws + w.lse_log2);
  a.dq_turn = reinterpret_cast<int*>(ws + w.turn);
  a.dbias_part = p.dbias.present() ? reinterpret_cast<float*>(ws + w.dbias_part) : nullptr;
  a.chunks = plan.chunks;
  a.groups_per_chunk = plan.groups_per_chunk;
  a.part_rows = plan.part_rows;
  a.part_cols = plan.part_cols;
  a.dq_chains = plan.dq_chains;
  TPF_RETURN_IF_ERROR(detail::cuda_status(
      "attention_backward", cudaMemsetAsync(a.dq_turn, 0, w.dbias_part - w.turn, stream)));
  return detail::cuda_status("attention_backward",
                             attn::launch_backward(a, p.q.dtype == DType::kFP16,
                                                   static_cast<int>(p.q.shape[4]), stream));
}

}  // namespace tpf
