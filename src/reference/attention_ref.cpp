// FP64 CPU reference of triangle attention, forward and backward (docs/DESIGN.md section 1).
// Straight loops over one (b, s, h) slice at a time, in double; work is spread over threads by
// fixed slice chunks and the bias gradient's partial sums are added in chunk order, so the
// result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "common/parallel.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::round_to;
using detail::store;

struct Dims {
  int64_t B, S, H, N, D;
};

Dims dims_of(const TensorView& q) {
  return {q.shape[0], q.shape[1], q.shape[2], q.shape[3], q.shape[4]};
}

// One (b, s, h) slice of a [B,S,H,N,D] view, copied to a dense N x D double matrix.
std::vector<double> gather_slice(const TensorView& t, const Dims& d, int64_t b, int64_t s,
                                 int64_t h) {
  std::vector<double> m(d.N * d.D);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t e = 0; e < d.D; ++e) m[n * d.D + e] = load(t, t.offset({b, s, h, n, e}));
  return m;
}

// Softmax probabilities of one slice: P (N x N, row q over keys k), exact O (N x D).
// Masked keys get probability 0; a row with every key masked is all zeros.
void slice_probs(const std::vector<double>& Q, const std::vector<double>& K,
                 const std::vector<double>& V, const std::vector<double>& bias,
                 const std::vector<char>& attend, const Dims& d, double scale,
                 std::vector<double>* P, std::vector<double>* O, std::vector<double>* lse) {
  const int64_t N = d.N, D = d.D;
  P->assign(N * N, 0.0);
  O->assign(N * D, 0.0);
  lse->assign(N, std::numeric_limits<double>::infinity());
  std::vector<double> s(N);
  // Only the mask decides that a row is fully masked: a NaN score (from q, k or the bias) must
  // reach the output as NaN, as in PyTorch's softmax, not read as "no key attended".
  if (std::none_of(attend.begin(), attend.end(), [](char a) { return a != 0; })) return;
  for (int64_t q = 0; q < N; ++q) {
    double m = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t k = 0; k < N; ++k) {
      if (!attend[k]) continue;
      double dot = 0.0;
      for (int64_t e = 0; e < D; ++e) dot += Q[q * D + e] * K[k * D + e];
      s[k] = scale * dot + bias[q * N + k];
      nan |= std::isnan(s[k]);
      m = std::max(m, s[k]);
    }
    if (nan) m = std::numeric_limits<double>::quiet_NaN();
    double sum = 0.0;
    for (int64_t k = 0; k < N; ++k)
      if (attend[k]) sum += ((*P)[q * N + k] = std::exp(s[k] - m));
    for (int64_t k = 0; k < N; ++k) (*P)[q * N + k] /= sum;
    (*lse)[q] = m + std::log(sum);
    for (int64_t k = 0; k < N; ++k) {
      const double p = (*P)[q * N + k];
      if (attend[k])
        for (int64_t e = 0; e < D; ++e) (*O)[q * D + e] += p * V[k * D + e];
    }
  }
}

std::vector<double> gather_bias(const TensorView& bias, const Dims& d, int64_t b, int64_t h) {
  std::vector<double> m(d.N * d.N);
  for (int64_t q = 0; q < d.N; ++q)
    for (int64_t k = 0; k < d.N; ++k) m[q * d.N + k] = load(bias, bias.offset({b, 0, h, q, k}));
  return m;
}

std::vector<char> gather_mask(const TensorView& mask, const Dims& d, int64_t b, int64_t s) {
  std::vector<char> m(d.N, 1);
  if (mask.present())
    for (int64_t k = 0; k < d.N; ++k) m[k] = load(mask, mask.offset({b, s, 0, 0, k})) != 0.0;
  return m;
}

double scale_of(const std::optional<double>& scale, int64_t D) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
}

}  // namespace

Status attention_forward(const AttentionForwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_attention_forward(p, /*for_gpu=*/false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "attention_forward", {{"q", p.q.data}, {"k", p.k.data}, {"v", p.v.data}, {"bias", p.bias.data},
                            {"mask", p.mask.data}, {"out", p.out.data},
                            {"out_residual", p.compensate ? p.out_residual.data : nullptr},
                            {"lse", p.lse.data}}));
  const Dims d = dims_of(p.q);
  const double scale = scale_of(p.scale, d.D);
  detail::parallel_for(d.B * d.S * d.H, [&](int64_t item) {
    const int64_t h = item % d.H, s = (item / d.H) % d.S, b = item / (d.H * d.S);
    const auto Q = gather_slice(p.q, d, b, s, h), K = gather_slice(p.k, d, b, s, h),
               V = gather_slice(p.v, d, b, s, h);
    const auto bias = gather_bias(p.bias, d, b, h);
    const auto attend = gather_mask(p.mask, d, b, s);
    std::vector<double> P, O, lse;
    slice_probs(Q, K, V, bias, attend, d, scale, &P, &O, &lse);
    for (int64_t n = 0; n < d.N; ++n) {
      for (int64_t e = 0; e < d.D; ++e) {
        const double o = O[n * d.D + e];
        const double rounded = round_to(p.out.dtype, o);
        store(p.out, p.out.offset({b, s, h, n, e}), o);
        if (p.compensate)
          store(p.out_residual, p.out_residual.offset({b, s, h, n, e}), o - rounded);
      }
      if (p.lse.present()) store(p.lse, p.lse.offset({b, s, h, n}), lse[n]);
    }
  });
  return Status::Ok();
}

Status attention_backward(const AttentionBackwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_attention_backward(p, /*for_gpu=*/false));
  TPF_RETURN_IF_ERROR(detail::check_host_pointers(
      "attention_backward",
      {{"q", p.q.data}, {"k", p.k.data}, {"v", p.v.data}, {"bias", p.bias.data}, {"mask", p.mask.data},
       {"out", p.out.data}, {"out_residual", p.compensate ? p.out_residual.data : nullptr},
       {"dout", p.dout.data}, {"dq", p.dq.data}, {"dk", p.dk.data}, {"dv", p.dv.data},
       {"dbias", p.dbias.data}}));
  const Dims d = dims_of(p.q);
  const int64_t N = d.N, D = d.D;
  const double scale = scale_of(p.scale, D);
  // Slices are cut into a fixed number of chunks; each (b, h, chunk) owns a dbias partial.
  const int64_t chunks = std::min<int64_t>(d.S, 16);
  const int64_t per_chunk = (d.S + chunks - 1) / chunks;
  const bool want_dbias = p.dbias.present();
  std::vector<double> dbias_part(want_dbias ? d.B * d.H * chunks * N * N : 0, 0.0);

  detail::parallel_for(d.B * d.H * chunks, [&](int64_t item) {
    const int64_t c = item % chunks, h = (item / chunks) % d.H, b = item / (chunks * d.H);
    const auto bias = gather_bias(p.bias, d, b, h);
    double* dbias = want_dbias ? &dbias_part[item * N * N] : nullptr;
    for (int64_t s = c * per_chunk; s < std::min(d.S, (c + 1) * per_chunk); ++s) {
      const auto Q = gather_slice(p.q, d, b, s, h), K = gather_slice(p.k, d, b, s, h),
                 V = gather_slice(p.v, d, b, s, h), dO = gather_slice(p.dout, d, b, s, h);
      const auto attend = gather_mask(p.mask, d, b, s);
      std::vector<double> P, O, lse;
      slice_probs(Q, K, V, bias, attend, d, scale, &P, &O, &lse);
      if (p.out.present()) {  // the correction uses the stored output (+ its residual)
        O = gather_slice(p.out, d, b, s, h);
        if (p.compensate) {
          const auto R = gather_slice(p.out_residual, d, b, s, h);
          for (int64_t i = 0; i < N * D; ++i) O[i] += R[i];
        }
      }
      std::vector<double> dQ(N * D, 0.0), dK(N * D, 0.0), dV(N * D, 0.0);
      for (int64_t q = 0; q < N; ++q) {
        double dlt = 0.0;
        for (int64_t e = 0; e < D; ++e) dlt += dO[q * D + e] * O[q * D + e];
        for (int64_t k = 0; k < N; ++k) {
          if (!attend[k]) continue;  // masked key (or fully masked row): no gradient
          const double pr = P[q * N + k];
          double dp = 0.0;
          for (int64_t e = 0; e < D; ++e) dp += dO[q * D + e] * V[k * D + e];
          const double ds = pr * (dp - dlt);
          for (int64_t e = 0; e < D; ++e) {
            dQ[q * D + e] += scale * ds * K[k * D + e];
            dK[k * D + e] += scale * ds * Q[q * D + e];
            dV[k * D + e] += pr * dO[q * D + e];
          }
          if (dbias) dbias[q * N + k] += ds;
        }
      }
      for (int64_t n = 0; n < N; ++n)
        for (int64_t e = 0; e < D; ++e) {
          store(p.dq, p.dq.offset({b, s, h, n, e}), dQ[n * D + e]);
          store(p.dk, p.dk.offset({b, s, h, n, e}), dK[n * D + e]);
          store(p.dv, p.dv.offset({b, s, h, n, e}), dV[n * D + e]);
        }
    }
  });
  if (want_dbias) {
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t i = 0; i < N * N; ++i) {
          double sum = 0.0;
          for (int64_t c = 0; c < chunks; ++c) sum += dbias_part[((b * d.H + h) * chunks + c) * N * N + i];
          store(p.dbias, p.dbias.offset({b, 0, h, i / N, i % N}), sum);
        }
  }
  return Status::Ok();
}

}  // namespace tpf::reference
