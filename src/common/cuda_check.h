// CUDA-side checks of the entry points: device pointers and runtime errors as Status.
#pragma once
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>
#include <utility>

#include "turbopairformer/status.h"

namespace tpf::detail {

inline Status cuda_status(const char* op, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError,
                std::string("tpf.") + op + ": CUDA error: " + cudaGetErrorString(e));
}

// kUnsupported unless the current device is sm_90 (the wgmma and TMA kernels').
inline Status require_sm90(const char* op) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major != 9)
    return Status(StatusCode::kUnsupported, std::string("tpf.") + op + ": the fused kernel needs an sm_90 GPU (wgmma, TMA)");
  return Status::Ok();
}

// Every named pointer (nullptr = absent, skipped) must be device-accessible memory. While
// `stream` is being captured into a CUDA graph the query is skipped: it is not a capturable
// call, and the same arguments were checked when the graph's warm-up call ran eagerly.
inline Status check_device_pointers(const char* op, cudaStream_t stream,
                                    std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    capture = cudaStreamCaptureStatusNone;
  }
  if (capture == cudaStreamCaptureStatusActive) return Status::Ok();
  for (const auto& [name, ptr] : ptrs) {
    if (!ptr) continue;
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kCudaError, std::string("tpf.") + op + ": argument '" + name +
                                                "': cannot query the pointer (" +
                                                cudaGetErrorString(e) + "); is a GPU present?");
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      return Status(StatusCode::kInvalidType,
                    std::string("tpf.") + op + ": argument '" + name +
                        "': expected device memory, got a host pointer");
  }
  return Status::Ok();
}

// For the CPU reference: every named pointer (nullptr = absent) must be host memory. Without a
// CUDA driver every pointer is host memory.
inline Status check_host_pointers(const char* op,
                                  std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  for (const auto& [name, ptr] : ptrs) {
    if (!ptr) continue;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
      cudaGetLastError();
      return Status::Ok();  // no driver or unknown pointer: host memory
    }
    if (attr.type == cudaMemoryTypeDevice)
      return Status(StatusCode::kInvalidType, std::string("tpf.") + op + ": argument '" + name +
                                                  "': the CPU reference needs host memory, got a "
                                                  "device pointer");
  }
  return Status::Ok();
}

}  // namespace tpf::detail
