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

}  // namespace tpf::detail
