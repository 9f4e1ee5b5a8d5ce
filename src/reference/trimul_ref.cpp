// FP64 CPU reference of the triangle multiplicative update, forward and backward
// (docs/DESIGN.md section 2). Plain loops in double over dense copies of each batch element.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cuda_check.h"
#include "common/host_dtype.h"
#include "common/parallel.h"
#include "reference/ref_math.h"
#include "turbopairformer/reference.h"

namespace tpf::reference {
namespace {

using detail::load;
using detail::store;
using Vec = std::vector<double>;

struct Dims {
  int64_t B, N, C, Ch;
};

Vec read_vec(const TensorView& t, int64_t n) {  // [n], or zeros when absent
  Vec v(n, 0.0);
  if (t.present())
    for (int64_t i = 0; i < n; ++i) v[i] = load(t, t.offset({i}));
  return v;
}

Vec read_mat(const TensorView& t, int64_t r, int64_t c) {  // [r, c] row-major
  Vec v(r * c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) v[i * c + j] = load(t, t.offset({i, j}));
  return v;
}

void write_vec(const TensorView& t, const Vec& v) {
  if (!t.present()) return;
  for (int64_t i = 0; i < t.shape[0]; ++i) store(t, t.offset({i}), v[i]);
}

void write_mat(const TensorView& t, const Vec& v) {
  if (!t.present()) return;
  const int64_t c = t.shape[1];
  for (int64_t i = 0; i < t.shape[0]; ++i)
    for (int64_t j = 0; j < c; ++j) store(t, t.offset({i, j}), v[i * c + j]);
}

struct Weights {
  Vec ln_in_w, ln_in_b, p_in_w, p_in_b, g_in_w, g_in_b, ln_out_w, ln_out_b, p_out_w, p_out_b,
      g_out_w, g_out_b;
};

Weights read_weights(const TrimulWeights& w, const Dims& d) {
  return {read_vec(w.norm_in_weight, d.C),         read_vec(w.norm_in_bias, d.C),
          read_mat(w.p_in_weight, 2 * d.Ch, d.C),  read_vec(w.p_in_bias, 2 * d.Ch),
          read_mat(w.g_in_weight, 2 * d.Ch, d.C),  read_vec(w.g_in_bias, 2 * d.Ch),
          read_vec(w.norm_out_weight, d.Ch),       read_vec(w.norm_out_bias, d.Ch),
          read_mat(w.p_out_weight, d.C, d.Ch),     read_vec(w.p_out_bias, d.C),
          read_mat(w.g_out_weight, d.C, d.C),      read_vec(w.g_out_bias, d.C)};
}

// LayerNorm over the last dim of `rows` rows of width `w`: y = xhat * gamma + beta.
void layer_norm(const Vec& x, int64_t rows, int64_t w, const Vec& gamma, const Vec& beta,
                double eps, Vec* xhat, Vec* rstd, Vec* y) {
  xhat->resize(rows * w);
  rstd->resize(rows);
  y->resize(rows * w);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0.0, var = 0.0;
    for (int64_t c = 0; c < w; ++c) mu += x[r * w + c];
    mu /= w;
    for (int64_t c = 0; c < w; ++c) var += (x[r * w + c] - mu) * (x[r * w + c] - mu);
    var /= w;
    (*rstd)[r] = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < w; ++c) {
      (*xhat)[r * w + c] = (x[r * w + c] - mu) * (*rstd)[r];
      (*y)[r * w + c] = (*xhat)[r * w + c] * gamma[c] + beta[c];
    }
  }
}

// Backward of layer_norm: accumulates dgamma, dbeta; returns dx.
Vec layer_norm_backward(const Vec& dy, const Vec& xhat, const Vec& rstd, int64_t rows, int64_t w,
                        const Vec& gamma, Vec* dgamma, Vec* dbeta) {
  Vec dx(rows * w);
  for (int64_t r = 0; r < rows; ++r) {
    double mean_g = 0.0, mean_gx = 0.0;
    for (int64_t c = 0; c < w; ++c) {
      const double g = dy[r * w + c] * gamma[c];
      (*dgamma)[c] += dy[r * w + c] * xhat[r * w + c];
      (*dbeta)[c] += dy[r * w + c];
      mean_g += g;
      mean_gx += g * xhat[r * w + c];
    }
    mean_g /= w;
    mean_gx /= w;
    for (int64_t c = 0; c < w; ++c)
      dx[r * w + c] = rstd[r] * (dy[r * w + c] * gamma[c] - mean_g - xhat[r * w + c] * mean_gx);
  }
  return dx;
}

// y[r, o] = sum_i x[r, i] W[o, i] + bias[o]. Accumulated as rows of Wᵀ (contiguous
// multiply-adds the compiler vectorises, unlike a dot-product reduction).
Vec linear(const Vec& x, int64_t rows, int64_t in, const Vec& W, const Vec& bias, int64_t out) {
  Vec WT(in * out);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) WT[i * out + o] = W[o * in + i];
  Vec y(rows * out);
  detail::parallel_for(rows, [&](int64_t r) {
    double* yr = &y[r * out];
    for (int64_t o = 0; o < out; ++o) yr[o] = bias[o];
    for (int64_t i = 0; i < in; ++i) {
      const double xi = x[r * in + i];
      const double* wt = &WT[i * out];
      for (int64_t o = 0; o < out; ++o) yr[o] += xi * wt[o];
    }
  });
  return y;
}

// Backward of linear: dx = dy W; dW += dy^T x; dbias += sum_r dy.
Vec linear_backward(const Vec& dy, const Vec& x, int64_t rows, int64_t in, const Vec& W,
                    int64_t out, Vec* dW, Vec* dbias) {
  Vec dx(rows * in, 0.0);
  detail::parallel_for(rows, [&](int64_t r) {
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) dx[r * in + i] += dy[r * out + o] * W[o * in + i];
  });
  // Each task owns a block of output rows of dW and streams x once (rows outermost), so x is
  // read once per block instead of once per output row.
  constexpr int64_t kBlock = 16;
  detail::parallel_for((out + kBlock - 1) / kBlock, [&](int64_t blk) {
    const int64_t o0 = blk * kBlock, o1 = std::min(out, o0 + kBlock);
    for (int64_t r = 0; r < rows; ++r) {
      const double* xr = &x[r * in];
      for (int64_t o = o0; o < o1; ++o) {
        const double g = dy[r * out + o];
        (*dbias)[o] += g;
        double* dw = &(*dW)[o * in];
        for (int64_t i = 0; i < in; ++i) dw[i] += g * xr[i];
      }
    }
  });
  return dx;
}

// Everything the forward computes for one batch element, kept for the backward.
struct Activations {
  Vec z, xhat_in, rstd_in, zn, lin_p, lin_g, mask, a, b, x, xhat_out, rstd_out, xn, y, gate_lin;
};

Activations forward_one(const TrimulForwardParams& p, const Weights& w, const Dims& d,
                        int64_t batch) {
  const int64_t N = d.N, C = d.C, Ch = d.Ch, P = N * N;
  Activations A;
  A.z.resize(P * C);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t c = 0; c < C; ++c)
        A.z[(i * N + j) * C + c] = load(p.z, p.z.offset({batch, i, j, c}));
  layer_norm(A.z, P, C, w.ln_in_w, w.ln_in_b, p.eps, &A.xhat_in, &A.rstd_in, &A.zn);
  A.lin_p = linear(A.zn, P, C, w.p_in_w, w.p_in_b, 2 * Ch);
  A.lin_g = linear(A.zn, P, C, w.g_in_w, w.g_in_b, 2 * Ch);
  A.mask.assign(P, 1.0);
  if (p.mask.present())
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j) A.mask[i * N + j] = load(p.mask, p.mask.offset({batch, i, j}));
  A.a.resize(P * Ch);
  A.b.resize(P * Ch);
  for (int64_t r = 0; r < P; ++r)
    for (int64_t c = 0; c < Ch; ++c) {
      const int64_t ia = r * 2 * Ch + c, ib = ia + Ch;
      A.a[r * Ch + c] = sigmoid(A.lin_g[ia]) * A.lin_p[ia] * A.mask[r];
      A.b[r * Ch + c] = sigmoid(A.lin_g[ib]) * A.lin_p[ib] * A.mask[r];
    }
  // Outgoing: x[i,j] = sum_k a[i,k] b[j,k]. Incoming: x[i,j] = sum_k a[k,i] b[k,j]. Loops run so
  // that the innermost two walk contiguous rows (j, then channels).
  const bool out_dir = p.direction == TrimulDirection::kOutgoing;
  A.x.assign(P * Ch, 0.0);
  detail::parallel_for(N, [&](int64_t i) {
    double* xi = &A.x[i * N * Ch];
    if (out_dir) {
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < N; ++k) {
          const double *ar = &A.a[(i * N + k) * Ch], *br = &A.b[(j * N + k) * Ch];
          for (int64_t c = 0; c < Ch; ++c) xi[j * Ch + c] += ar[c] * br[c];
        }
    } else {
      for (int64_t k = 0; k < N; ++k) {
        const double* ar = &A.a[(k * N + i) * Ch];
        for (int64_t j = 0; j < N; ++j) {
          const double* br = &A.b[(k * N + j) * Ch];
          for (int64_t c = 0; c < Ch; ++c) xi[j * Ch + c] += ar[c] * br[c];
        }
      }
    }
  });
  layer_norm(A.x, P, Ch, w.ln_out_w, w.ln_out_b, p.eps, &A.xhat_out, &A.rstd_out, &A.xn);
  A.y = linear(A.xn, P, Ch, w.p_out_w, w.p_out_b, C);
  A.gate_lin = linear(A.zn, P, C, w.g_out_w, w.g_out_b, C);
  return A;
}

// The residual update's operands at (batch, i, j, c): the residual, and the scale (1 where absent).
double residual_at(const TrimulForwardParams& p, int64_t b, int64_t i, int64_t j, int64_t c) {
  return load(p.residual, p.residual.offset({b, i, j, c}));
}
double scale_at(const TrimulForwardParams& p, int64_t b, int64_t i, int64_t j, int64_t c) {
  return p.scale.present() ? load(p.scale, p.scale.offset({b, i, j, c})) : 1.0;
}

}  // namespace

static Status check_host(const char* op, const TrimulForwardParams& f) {
  const TrimulWeights& w = f.w;
  return detail::check_host_pointers(
      op, {{"z", f.z.data}, {"mask", f.mask.data}, {"residual", f.residual.data}, {"scale", f.scale.data},
           {"norm_in_weight", w.norm_in_weight.data},
           {"p_in_weight", w.p_in_weight.data}, {"g_in_weight", w.g_in_weight.data},
           {"norm_out_weight", w.norm_out_weight.data}, {"p_out_weight", w.p_out_weight.data},
           {"g_out_weight", w.g_out_weight.data}});
}

Status trimul_forward(const TrimulForwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_trimul_forward(p, /*for_gpu=*/false));
  TPF_RETURN_IF_ERROR(check_host("triangle_multiplicative_update", p));
  const Dims d{p.z.shape[0], p.z.shape[1], p.z.shape[3], p.w.p_in_weight.shape[0] / 2};
  const Weights w = read_weights(p.w, d);
  for (int64_t batch = 0; batch < d.B; ++batch) {
    const Activations A = forward_one(p, w, d, batch);
    for (int64_t i = 0; i < d.N; ++i)
      for (int64_t j = 0; j < d.N; ++j)
        for (int64_t c = 0; c < d.C; ++c) {
          const int64_t r = (i * d.N + j) * d.C + c;
          const double u = sigmoid(A.gate_lin[r]) * A.y[r];
          store(p.out, p.out.offset({batch, i, j, c}),
                p.residual.present() ? residual_at(p, batch, i, j, c) + scale_at(p, batch, i, j, c) * u : u);
        }
  }
  return Status::Ok();
}

Status trimul_backward(const TrimulBackwardParams& p) {
  TPF_RETURN_IF_ERROR(validate_trimul_backward(p, /*for_gpu=*/false));
  TPF_RETURN_IF_ERROR(check_host("triangle_multiplicative_update_backward", p.fwd));
  const TrimulForwardParams& f = p.fwd;
  const Dims d{f.z.shape[0], f.z.shape[1], f.z.shape[3], f.w.p_in_weight.shape[0] / 2};
  const int64_t N = d.N, C = d.C, Ch = d.Ch, P = N * N;
  const Weights w = read_weights(f.w, d);
  Weights g{Vec(C, 0.0),          Vec(C, 0.0),  Vec(2 * Ch * C, 0.0), Vec(2 * Ch, 0.0),
            Vec(2 * Ch * C, 0.0), Vec(2 * Ch, 0.0), Vec(Ch, 0.0),      Vec(Ch, 0.0),
            Vec(C * Ch, 0.0),     Vec(C, 0.0),  Vec(C * C, 0.0),       Vec(C, 0.0)};
  const bool out_dir = f.direction == TrimulDirection::kOutgoing;
  for (int64_t batch = 0; batch < d.B; ++batch) {
    const Activations A = forward_one(f, w, d, batch);
    Vec dout(P * C);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t c = 0; c < C; ++c)
          dout[(i * N + j) * C + c] = load(p.dout, p.dout.offset({batch, i, j, c}));
    // out = sigmoid(gate_lin) * y
    Vec dgate_lin(P * C), dy(P * C);
    for (int64_t r = 0; r < P * C; ++r) {
      const double s = sigmoid(A.gate_lin[r]);
      dgate_lin[r] = dout[r] * A.y[r] * s * (1.0 - s);
      dy[r] = dout[r] * s;
    }
    Vec dzn = linear_backward(dgate_lin, A.zn, P, C, w.g_out_w, C, &g.g_out_w, &g.g_out_b);
    const Vec dxn = linear_backward(dy, A.xn, P, Ch, w.p_out_w, C, &g.p_out_w, &g.p_out_b);
    const Vec dx = layer_norm_backward(dxn, A.xhat_out, A.rstd_out, P, Ch, w.ln_out_w,
                                       &g.ln_out_w, &g.ln_out_b);
    // Outgoing: da[i,k] = sum_j dx[i,j] b[j,k], db[j,k] = sum_i dx[i,j] a[i,k].
    // Incoming: da[k,i] = sum_j dx[i,j] b[k,j], db[k,j] = sum_i dx[i,j] a[k,i].
    // Each task owns row u of da and db; the t loop sits outside v so that the v, c loops walk
    // contiguous rows.
    Vec da(P * Ch, 0.0), db(P * Ch, 0.0);
    auto madd = [Ch](double* acc, const double* x, const double* y) {
      for (int64_t c = 0; c < Ch; ++c) acc[c] += x[c] * y[c];
    };
    detail::parallel_for(N, [&](int64_t u) {
      double *dau = &da[u * N * Ch], *dbu = &db[u * N * Ch];
      if (out_dir) {  // da[u,v] += dx[u,t] b[t,v];  db[u,v] += dx[t,u] a[t,v]
        for (int64_t t = 0; t < N; ++t)
          for (int64_t v = 0; v < N; ++v) {
            madd(dau + v * Ch, &dx[(u * N + t) * Ch], &A.b[(t * N + v) * Ch]);
            madd(dbu + v * Ch, &dx[(t * N + u) * Ch], &A.a[(t * N + v) * Ch]);
          }
      } else {        // da[u,v] += dx[v,t] b[u,t];  db[u,v] += dx[t,v] a[u,t]
        for (int64_t v = 0; v < N; ++v)
          for (int64_t t = 0; t < N; ++t)
            madd(dau + v * Ch, &dx[(v * N + t) * Ch], &A.b[(u * N + t) * Ch]);
        for (int64_t t = 0; t < N; ++t)
          for (int64_t v = 0; v < N; ++v)
            madd(dbu + v * Ch, &dx[(t * N + v) * Ch], &A.a[(u * N + t) * Ch]);
      }
    });

    // a = sigmoid(lin_g) * lin_p * mask (b likewise, in the second half of the 2Ch columns)
    Vec dlin_p(P * 2 * Ch), dlin_g(P * 2 * Ch);
    for (int64_t r = 0; r < P; ++r)
      for (int64_t c = 0; c < 2 * Ch; ++c) {
        const int64_t i = r * 2 * Ch + c;
        const double up = c < Ch ? da[r * Ch + c] : db[r * Ch + c - Ch];
        const double s = sigmoid(A.lin_g[i]);
        dlin_p[i] = up * s * A.mask[r];
        dlin_g[i] = up * A.lin_p[i] * A.mask[r] * s * (1.0 - s);
      }
    const Vec dzn_p = linear_backward(dlin_p, A.zn, P, C, w.p_in_w, 2 * Ch, &g.p_in_w, &g.p_in_b);
    const Vec dzn_g = linear_backward(dlin_g, A.zn, P, C, w.g_in_w, 2 * Ch, &g.g_in_w, &g.g_in_b);
    for (int64_t r = 0; r < P * C; ++r) dzn[r] += dzn_p[r] + dzn_g[r];
    const Vec dz = layer_norm_backward(dzn, A.xhat_in, A.rstd_in, P, C, w.ln_in_w, &g.ln_in_w,
                                       &g.ln_in_b);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t c = 0; c < C; ++c) {
          const double add = p.dz_in.present() ? load(p.dz_in, p.dz_in.offset({batch, i, j, c})) : 0.0;
          store(p.dz, p.dz.offset({batch, i, j, c}), dz[(i * N + j) * C + c] + add);
        }
  }
  const TrimulWeights& dw = p.dw;
  write_vec(dw.norm_in_weight, g.ln_in_w);
  write_vec(dw.norm_in_bias, g.ln_in_b);
  write_mat(dw.p_in_weight, g.p_in_w);
  write_vec(dw.p_in_bias, g.p_in_b);
  write_mat(dw.g_in_weight, g.g_in_w);
  write_vec(dw.g_in_bias, g.g_in_b);
  write_vec(dw.norm_out_weight, g.ln_out_w);
  write_vec(dw.norm_out_bias, g.ln_out_b);
  write_mat(dw.p_out_weight, g.p_out_w);
  write_vec(dw.p_out_bias, g.p_out_b);
  write_mat(dw.g_out_weight, g.g_out_w);
  write_vec(dw.g_out_bias, g.g_out_b);
  return Status::Ok();
}

}  // namespace tpf::reference
