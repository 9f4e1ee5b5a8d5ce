// A minimal fixed-partition parallel loop for the CPU reference. Work item i always runs the
// same code on the same data whatever the thread count, so results do not depend on it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace tpf::detail {

inline int reference_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, 64u));
}

template <class F>
void parallel_for(int64_t count, F&& body) {
  const int64_t threads = std::min<int64_t>(reference_threads(), count);
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < count; i += threads) body(i);
    });
  for (auto& th : pool) th.join();
}

}  // namespace tpf::detail
