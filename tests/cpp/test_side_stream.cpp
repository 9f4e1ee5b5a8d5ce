// The fork/join helper of the multiplicative-update backward (common/side_stream.h). Without a
// GPU both sequences stay on the caller's stream and every step succeeds (nothing to order);
// with one, the side sequence gets its own stream and the fork and join succeed.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "common/side_stream.h"

namespace tpf::test {
namespace {

TEST(SideStream, ForksWhereThereIsAGpuAndStaysInOrderWhereNot) {
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  detail::Fork fork(nullptr);
  if (gpu) EXPECT_NE(fork.side(), nullptr) << "a GPU is present: the side sequence gets its own stream";
  else EXPECT_EQ(fork.side(), nullptr) << "no GPU: the side sequence runs on the caller's stream";
  EXPECT_EQ(fork.begin(), cudaSuccess);
  EXPECT_EQ(fork.join(), cudaSuccess);
  detail::Fork again(nullptr);  // the same thread and device reuse the stream
  EXPECT_EQ(again.side(), fork.side());
}

}  // namespace
}  // namespace tpf::test
