// Triangle multiplicative update CUDA entry points. The fused kernels land with issue 5; until
// then the entry points validate their arguments and report kUnsupported.
#include "turbopairformer/trimul.h"

namespace tpf {

Status trimul_forward(const TrimulForwardParams& p, cudaStream_t) {
  TPF_RETURN_IF_ERROR(validate_trimul_forward(p, /*for_gpu=*/true));
  return Status(StatusCode::kUnsupported,
                "tpf.triangle_multiplicative_update: the CUDA kernels are not built yet; use "
                "tpf::reference::trimul_forward");
}

Status trimul_backward(const TrimulBackwardParams& p, void*, size_t, cudaStream_t) {
  TPF_RETURN_IF_ERROR(validate_trimul_backward(p, /*for_gpu=*/true));
  return Status(StatusCode::kUnsupported,
                "tpf.triangle_multiplicative_update_backward: the CUDA kernels are not built yet; "
                "use tpf::reference::trimul_backward");
}

}  // namespace tpf
