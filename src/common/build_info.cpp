#include <cuda_runtime.h>

#include "turbopairformer/turbopairformer.h"

namespace tpf {

const char* version() { return TPF_VERSION; }

const char* build_info() {
  return "turbopairformer " TPF_VERSION "; C++: " TPF_CXX_COMPILER "; nvcc " TPF_CUDA_COMPILER_VERSION
         "; device code: sm_90a (Hopper: H100, H200); CUDA runtime linked statically";
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

}  // namespace tpf
