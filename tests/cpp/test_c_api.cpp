// The C ABI the Python package loads: codes, messages and results match the C++ API.
#include <gtest/gtest.h>

#include <cmath>

#include "testing/attention_problem.h"
#include "testing/trimul_problem.h"
#include "turbopairformer/c_api.h"

namespace tpf::test {
namespace {

tpf_tensor c_tensor(const TensorView& v) {
  tpf_tensor t{};
  t.data = v.data;
  t.dtype = static_cast<int32_t>(v.dtype);
  t.rank = v.rank;
  for (int i = 0; i < kMaxRank; ++i) {
    t.shape[i] = v.shape[i];
    t.stride[i] = v.stride[i];
  }
  return t;
}

tpf_attention_args c_args(AttnProblem& p) {
  tpf_attention_args a{};
  a.q = c_tensor(p.q.view);
  a.k = c_tensor(p.k.view);
  a.v = c_tensor(p.v.view);
  a.bias = c_tensor(p.bias.view);
  a.mask = c_tensor(p.mask.view);
  a.out = c_tensor(p.out.view);
  a.out_residual = c_tensor(p.res.view);
  a.lse = c_tensor(p.lse.view);
  a.dout = c_tensor(p.dout.view);
  a.dq = c_tensor(p.dq.view);
  a.dk = c_tensor(p.dk.view);
  a.dv = c_tensor(p.dv.view);
  a.dbias = c_tensor(p.dbias.view);
  a.scale = std::nan("");
  a.compensate = 1;
  return a;
}

TEST(CApi, AttentionMatchesTheCppReference) {
  auto p = AttnProblem::random({1, 2, 2, 6, 4}, 5);
  auto q = AttnProblem::random({1, 2, 2, 6, 4}, 5);
  ASSERT_TRUE(reference::attention_forward(p.fwd()).ok());
  ASSERT_TRUE(reference::attention_backward(p.bwd()).ok());
  auto a = c_args(q);
  char err[256] = "";
  ASSERT_EQ(tpf_attention_forward(&a, 0, nullptr, err, sizeof(err)), 0) << err;
  ASSERT_EQ(tpf_attention_backward(&a, 0, nullptr, 0, nullptr, err, sizeof(err)), 0) << err;
  EXPECT_EQ(max_abs_diff(p.out.values(), q.out.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dq.values(), q.dq.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dbias.values(), q.dbias.values()), 0.0);
}

TEST(CApi, ErrorsCarryTheStatusCodeAndTheMessage) {
  auto p = AttnProblem::random({1, 2, 2, 6, 4}, 6);
  auto a = c_args(p);
  char err[256] = "";
  a.k.shape[3] = 5;
  EXPECT_EQ(tpf_attention_forward(&a, 0, nullptr, err, sizeof(err)),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(err).find("'k'"), std::string::npos) << err;
  a = c_args(p);
  a.mask.dtype = static_cast<int32_t>(DType::kFP32);
  EXPECT_EQ(tpf_attention_forward(&a, 0, nullptr, err, sizeof(err)),
            static_cast<int>(StatusCode::kInvalidType));
  a = c_args(p);
  a.scale = 0.0;  // NaN means "default"; zero is a bad scale
  EXPECT_EQ(tpf_attention_forward(&a, 0, nullptr, err, sizeof(err)),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(err).find("'scale'"), std::string::npos) << err;
  char tiny[8];
  a.k.shape[3] = 5;
  tpf_attention_forward(&a, 0, nullptr, tiny, sizeof(tiny));
  EXPECT_EQ(std::string(tiny).size(), 7u);  // truncated, terminated
}

tpf_trimul_args c_trimul_args(TrimulProblem& q) {
  tpf_trimul_args a{};
  a.z = c_tensor(q.z.view);
  a.mask = c_tensor(q.mask.view);
  a.out = c_tensor(q.out.view);
  a.dout = c_tensor(q.dout.view);
  a.dz = c_tensor(q.dz.view);
  for (int i = 0; i < TPF_TRIMUL_WEIGHTS; ++i) {
    a.w[i] = c_tensor(q.w[i].view);
    a.dw[i] = c_tensor(q.dw[i].view);
  }
  a.direction = 0;
  a.eps = 1e-5;
  return a;
}

TEST(CApi, TrimulMatchesTheCppReference) {
  auto p = TrimulProblem::random(1, 4, 3, 2, 7);
  auto q = TrimulProblem::random(1, 4, 3, 2, 7);
  ASSERT_TRUE(reference::trimul_backward(p.bwd()).ok());
  ASSERT_TRUE(reference::trimul_forward(p.fwd()).ok());
  tpf_trimul_args a = c_trimul_args(q);
  char err[256] = "";
  ASSERT_EQ(tpf_trimul_forward(&a, 0, nullptr, 0, nullptr, err, sizeof(err)), 0) << err;
  ASSERT_EQ(tpf_trimul_backward(&a, 0, nullptr, 0, nullptr, err, sizeof(err)), 0) << err;
  EXPECT_EQ(max_abs_diff(p.out.values(), q.out.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dz.values(), q.dz.values()), 0.0);
  EXPECT_EQ(max_abs_diff(p.dw[2].values(), q.dw[2].values()), 0.0);
}

// The workspace query needs no GPU: it validates the GPU constraints and sizes the buffers.
TEST(CApi, TrimulWorkspaceQuery) {
  auto q = TrimulProblem::random(1, 9, 32, 64, 8, DType::kBF16, DType::kBF16);
  tpf_trimul_args a = c_trimul_args(q);
  char err[256] = "";
  size_t fwd = 0, bwd = 0;
  ASSERT_EQ(tpf_trimul_workspace_size(&a, 0, &fwd, err, sizeof(err)), 0) << err;
  ASSERT_EQ(tpf_trimul_workspace_size(&a, 1, &bwd, err, sizeof(err)), 0) << err;
  EXPECT_GT(fwd, size_t{9 * 9 * 64 * 2 * 3});  // at least a, b and x
  EXPECT_GT(bwd, fwd);
  auto odd = TrimulProblem::random(1, 9, 48, 64, 8, DType::kBF16, DType::kBF16);  // C = 48
  a = c_trimul_args(odd);
  EXPECT_EQ(tpf_trimul_workspace_size(&a, 0, &fwd, err, sizeof(err)),
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(err).find("C=48"), std::string::npos) << err;
}

// The training buffer: its size from the shapes alone (the C ABI's query, used by the Python
// op's fake implementation) equals the parameter query's; a call with a short or misaligned
// buffer is refused naming it, before any GPU work (the pointers are never dereferenced).
TEST(CApi, TrimulSavedBufferSizeAndRefusals) {
  auto q = TrimulProblem::random(2, 9, 32, 64, 8, DType::kBF16, DType::kBF16);
  TrimulForwardParams f = q.fwd();
  size_t need = 0;
  ASSERT_TRUE(trimul_saved_size(f, &need).ok());
  EXPECT_EQ(tpf_trimul_saved_size(2, 9, 32, 64), need);  // B, N, C, Ch
  EXPECT_GT(need, size_t{2 * 9 * 9 * (32 + 32) * 2});
  EXPECT_EQ(tpf_trimul_saved_size(2, 0, 32, 64), 0u);
  EXPECT_GT(tpf_trimul_saved_size(2, 10, 32, 64), need);
  size_t plain = 0, saving = 0;
  ASSERT_TRUE(trimul_forward_workspace_size(f, &plain).ok());
  f.saved = reinterpret_cast<void*>(uintptr_t{1} << 41);
  f.saved_bytes = need - 1;
  ASSERT_TRUE(trimul_forward_workspace_size(f, &saving).ok());
  EXPECT_LT(saving, plain);  // the saved set moves out of the workspace
  void* ws = reinterpret_cast<void*>(uintptr_t{1} << 40);
  Status st = trimul_forward(f, ws, saving, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'saved'"), std::string::npos) << st.message();
  f.saved_bytes = need;
  f.saved = static_cast<char*>(f.saved) + 16;
  st = trimul_forward(f, ws, saving, nullptr);
  EXPECT_NE(st.message().find("256-byte aligned"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tpf::test
