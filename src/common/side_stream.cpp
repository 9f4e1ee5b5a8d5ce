#include "common/side_stream.h"

namespace tpf::detail {
namespace {

struct SideResources {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;
};

constexpr int kMaxDevices = 64;

// Per host thread: two threads never share events, so one's record cannot satisfy the other's
// wait. Never destroyed (a stream or event of a finished thread costs a few bytes).
SideResources* resources_for(cudaStream_t main) {
  thread_local SideResources per_device[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return nullptr;
  }
  SideResources& r = per_device[device];
  if (r.stream) return &r;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(main, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return nullptr;  // no creation inside a capture: run in order this time
  }
  if (cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&r.forked, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    r = SideResources{};  // (a partly created set is leaked, not reused)
    return nullptr;
  }
  r.device = device;
  return &r;
}

}  // namespace

Fork::Fork(cudaStream_t main) : main_(main), side_(main) {
  if (SideResources* r = resources_for(main)) {
    side_ = r->stream;
    forked_ = r->forked;
    done_ = r->done;
  }
}

cudaError_t Fork::begin() {
  if (side_ == main_) return cudaSuccess;
  cudaError_t e = cudaEventRecord(forked_, main_);
  return e != cudaSuccess ? e : cudaStreamWaitEvent(side_, forked_, 0);
}

cudaError_t Fork::join() {
  if (side_ == main_) return cudaSuccess;
  cudaError_t e = cudaEventRecord(done_, side_);
  return e != cudaSuccess ? e : cudaStreamWaitEvent(main_, done_, 0);
}

}  // namespace tpf::detail
