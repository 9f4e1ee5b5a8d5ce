// Status: the result of every public call. A failed call carries a human-readable message
// naming the argument at fault and what was expected; nothing was written to any output.
#pragma once
#include <string>
#include <utility>

namespace tpf {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a shape, stride, pointer or flag is wrong
  kInvalidType = 5,      // a dtype, or the memory kind (host / device), is wrong
  kUnsupported = 2,      // valid, but this build or device does not implement it
  kCudaError = 3,        // the CUDA runtime reported an error
  kWorkspaceTooSmall = 4,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  explicit operator bool() const { return ok(); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* status_code_name(StatusCode code);

}  // namespace tpf

// Propagate a failed Status to the caller.
#define TPF_RETURN_IF_ERROR(expr)      \
  do {                                 \
    ::tpf::Status tpf_status_ = (expr); \
    if (!tpf_status_.ok()) return tpf_status_; \
  } while (0)
