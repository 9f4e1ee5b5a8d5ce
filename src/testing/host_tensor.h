// Host tensors for tests and `tpf check`: owned storage + a TensorView, any dtype, any physical dim order.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/host_dtype.h"
#include "turbopairformer/turbopairformer.h"

namespace tpf::test {

struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;

  // `order` lists the logical dims from outermost to innermost in memory (default: row-major);
  // `pad` adds that many elements to the stride of every dim but the innermost.
  static HostTensor make(DType dt, std::vector<int64_t> shape, std::vector<int> order = {},
                         int64_t pad = 0) {
    HostTensor t;
    const int rank = static_cast<int>(shape.size());
    if (order.empty()) {
      order.resize(rank);
      std::iota(order.begin(), order.end(), 0);
    }
    t.view.dtype = dt;
    t.view.rank = rank;
    int64_t stride = 1;  // innermost dim dense, every outer extent padded by `pad`
    for (int i = rank - 1; i >= 0; --i) {
      const int d = order[i];
      t.view.shape[d] = shape[d];
      t.view.stride[d] = stride;
      stride = stride * shape[d] + pad;
    }
    t.bytes.assign(static_cast<size_t>(stride) * dtype_size(dt) + 64, 0);
    t.view.data = t.bytes.data();
    return t;
  }

  int64_t numel() const { return view.numel(); }

  // Visit every logical multi-index (row-major) with its element offset.
  template <class F>
  void for_each(F&& f) const {
    std::vector<int64_t> idx(view.rank, 0);
    const int64_t n = numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t off = 0;
      for (int d = 0; d < view.rank; ++d) off += idx[d] * view.stride[d];
      f(i, off);
      for (int d = view.rank - 1; d >= 0; --d) {
        if (++idx[d] < view.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  double at(int64_t off) const { return detail::load(view, off); }
  void set(int64_t off, double v) { detail::store(view, off, v); }

  void fill_normal(std::mt19937_64& rng, double stddev = 1.0) {
    std::normal_distribution<double> nd(0.0, stddev);
    for_each([&](int64_t, int64_t off) { set(off, nd(rng)); });
  }
  void fill(double v) {
    for_each([&](int64_t, int64_t off) { set(off, v); });
  }
  // Logical (row-major) values as doubles.
  std::vector<double> values() const {
    std::vector<double> out(numel());
    for_each([&](int64_t i, int64_t off) { out[i] = at(off); });
    return out;
  }
  void set_values(const std::vector<double>& v) {
    for_each([&](int64_t i, int64_t off) { set(off, v[i]); });
  }
  // A fresh copy with another layout or dtype.
  HostTensor copy_as(DType dt, std::vector<int> order = {}, int64_t pad = 0) const {
    std::vector<int64_t> shape(view.shape, view.shape + view.rank);
    HostTensor t = make(dt, shape, order, pad);
    t.set_values(values());
    return t;
  }
};

// A bool mask [B,S,1,1,N] with each key attended with probability `keep`.
inline HostTensor random_key_mask(std::mt19937_64& rng, int64_t B, int64_t S, int64_t N,
                                  double keep) {
  HostTensor m = HostTensor::make(DType::kBool, {B, S, 1, 1, N});
  std::bernoulli_distribution bd(keep);
  m.for_each([&](int64_t, int64_t off) { m.set(off, bd(rng) ? 1.0 : 0.0); });
  return m;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

inline double rel_rmse(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace tpf::test
