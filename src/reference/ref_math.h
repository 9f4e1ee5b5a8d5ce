// Scalar math the FP64 references share.
#pragma once
#include <cmath>

namespace tpf::reference {

inline double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

}  // namespace tpf::reference
