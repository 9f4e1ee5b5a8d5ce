// Device copies of host tensors for the GPU runners: storage copied as is (strides and padding
// kept), or poisoned with 0xff bytes (NaN in every float type) for outputs.
#pragma once
#include <cstdint>
#include <vector>

#include "testing/device_buffer.h"
#include "testing/host_tensor.h"

namespace tpf::harness {

struct DeviceTensor {
  DeviceBuffer buf;
  TensorView view;
};

inline DeviceTensor to_device(const test::HostTensor& h, bool poison) {
  DeviceTensor d{DeviceBuffer(h.bytes.size()), h.view};
  d.view.data = d.buf.get();
  if (poison) cuda_ok(cudaMemset(d.buf.get(), 0xff, h.bytes.size()), "cudaMemset");
  else cuda_ok(cudaMemcpy(d.buf.get(), h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice), "H2D");
  return d;
}

inline std::vector<uint8_t> bytes_of(const DeviceTensor& d) {
  std::vector<uint8_t> out(d.buf.bytes());
  cuda_ok(cudaMemcpy(out.data(), d.buf.get(), out.size(), cudaMemcpyDeviceToHost), "D2H");
  return out;
}

// Copies a device result back into its host tensor.
inline void fetch(test::HostTensor& h, const DeviceTensor& d) {
  h.bytes = bytes_of(d);
  h.view.data = h.bytes.data();
}

// Relative RMSE of results against an FP64 reference, and each one's floor: the reference
// rounded once to `floor_dtype`.
struct ErrorTable {
  std::vector<std::string> names;
  std::vector<double> error, floor;
  void add(const char* name, const test::HostTensor& got, const test::HostTensor& ref,
           DType floor_dtype) {
    const auto xv = ref.values();
    std::vector<double> rounded(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) rounded[i] = detail::round_to(floor_dtype, xv[i]);
    names.push_back(name);
    error.push_back(test::rel_rmse(got.values(), xv));
    floor.push_back(test::rel_rmse(rounded, xv));
  }
};

}  // namespace tpf::harness
