#include "common/kernel_attrs.h"

#include <mutex>
#include <vector>

namespace tpf::detail {

cudaError_t allow_dynamic_smem(const void* kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  struct Entry {
    const void* kernel;
    int device, bytes;
  };
  static std::mutex mutex;
  static std::vector<Entry> done;  // a few dozen kernels x devices: a linear search is enough
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& x : done)
    if (x.kernel == kernel && x.device == device && x.bytes >= bytes) return cudaSuccess;
  if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) != cudaSuccess) return e;
  done.push_back({kernel, device, bytes});
  return cudaSuccess;
}

cudaError_t persistent_grid(int64_t tiles, int blocks_per_sm, unsigned* grid) {
  int device = 0, sms = 0;
  cudaError_t e;
  if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return e;
  const int64_t most = int64_t{sms} * blocks_per_sm;
  *grid = static_cast<unsigned>(tiles < most ? tiles : most);
  return cudaSuccess;
}

}  // namespace tpf::detail
