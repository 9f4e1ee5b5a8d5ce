// A minimal fixed-partition parallel loop for the CPU reference. Work item i always runs the
// same code on the same data whatever the thread count, so results do not depend on it; where
// the system refuses a thread, the calling thread runs that thread's partitions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <system_error>
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
  auto part = [&](int64_t t) {
    for (int64_t i = t; i < count; i += threads) body(i);
  };
  std::vector<std::thread> pool;
  int64_t t = 0;
  try {
    for (; t < threads; ++t) pool.emplace_back(part, t);
  } catch (const std::system_error&) {  // no thread to be had: this one runs what is left
    for (; t < threads; ++t) part(t);
  }
  for (auto& th : pool) th.join();
}

}  // namespace tpf::detail
