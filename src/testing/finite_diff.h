// Central-difference gradient check: the largest |analytic - numeric| over every element of
// `x`, relative to the largest |analytic| (at least 1e-3).
#pragma once
#include <functional>

#include "testing/host_tensor.h"

namespace tpf::harness {

inline double finite_difference_error(test::HostTensor& x, const std::vector<double>& analytic,
                                      const std::function<double()>& loss, double h = 1e-6) {
  std::vector<double> numeric(analytic.size());
  x.for_each([&](int64_t i, int64_t off) {
    const double x0 = x.at(off);
    x.set(off, x0 + h);
    const double lp = loss();
    x.set(off, x0 - h);
    const double lm = loss();
    x.set(off, x0);
    numeric[i] = (lp - lm) / (2 * h);
  });
  double scale = 1e-3;
  for (double a : analytic) scale = std::max(scale, std::fabs(a));
  return test::max_abs_diff(analytic, numeric) / scale;
}

// sum(out * dout): its gradient with respect to anything is what a backward with upstream
// gradient dout returns.
inline double dot(const test::HostTensor& a, const test::HostTensor& b) {
  const auto x = a.values(), y = b.values();
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

}  // namespace tpf::harness
