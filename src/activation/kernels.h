// Host launchers of the gated-activation kernels (gated.cu): y = f(a) * b row by row over
// [rows, W] operands, each with its own row stride, for
//   kSilu     f(a) = a sigmoid(a)   the SwiGLU of the transitions (a, b the halves of one row)
//   kSigmoid  f(a) = sigmoid(a)     the gate of the attention layers (a the gate, b the output)
// W a multiple of 8; every pointer and row stride 16-byte aligned. Each returns the launch error.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "turbopairformer/tensor.h"

namespace tpf::act {

enum class Gate { kSilu, kSigmoid };

struct Shape {
  Gate gate;
  int64_t rows, W;
  DType dtype;
};

// Row r of an operand starts at p + r * stride (elements of the shape's dtype).
struct Rows {
  const void* p;
  int64_t stride;
};

// The sigmoid gate backward's per-head sums for the attention backward (gate.h's delta):
// p[b, i, j, h] (through `stride`) = sum over head h's D columns of row r = (b I + i) J + j of
// db (b + res), db as stored. p nullptr: none. 16-bit dtypes, D / 8 a power of two up to 32.
struct HeadDots {
  float* p = nullptr;
  int64_t I = 1, J = 1, D = 8;
  int64_t stride[4] = {0, 0, 0, 0};  // b, i, j, h
  Rows res = {nullptr, 0};           // b's rounding residual (p nullptr: none)
};

cudaError_t forward(const Shape& s, Rows a, Rows b, Rows y, cudaStream_t st);
// da = dy b f'(a), db = dy f(a), and y = f(a) b again (bitwise the forward's) where y.p is set;
// the head sums where dots.p is set.
cudaError_t backward(const Shape& s, Rows a, Rows b, Rows dy, Rows da, Rows db, Rows y, const HeadDots& dots,
                     cudaStream_t st);

}  // namespace tpf::act
