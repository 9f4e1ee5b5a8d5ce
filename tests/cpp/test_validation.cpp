// Every rejection names the argument and what was expected, and writes nothing: outputs are
// poisoned before the call and must still hold the poison after it. The CUDA entry points are
// called too: they must reject before touching the device (these run on machines with no GPU).
#include <gtest/gtest.h>

#include <functional>

#include "testing/attention_problem.h"
#include "testing/trimul_problem.h"

namespace tpf::test {
namespace {

constexpr double kPoison = 7.0;

enum class Entry { kRefFwd, kRefBwd, kGpuFwd, kGpuBwd, kTrimulRefFwd, kTrimulRefBwd, kTrimulGpuFwd };

struct Case {
  const char* name;
  Entry entry;
  std::function<void(AttentionForwardParams&, AttentionBackwardParams&, TrimulForwardParams&,
                     TrimulBackwardParams&)>
      mutate;
  const char* argument;  // must appear quoted in the message
  const char* expect;    // and this text too
  StatusCode code = StatusCode::kInvalidArgument;
};

class Rejects : public ::testing::TestWithParam<Case> {};

bool is_gpu(Entry e) { return e == Entry::kGpuFwd || e == Entry::kGpuBwd || e == Entry::kTrimulGpuFwd; }

TEST_P(Rejects, NamesTheArgumentAndWritesNothing) {
  const Case& c = GetParam();
  // GPU entry points get a problem the kernels support (bf16, D = 16), the reference fp64.
  const bool gpu = is_gpu(c.entry);
  auto ap = AttnProblem::random({1, 2, 2, 5, gpu ? 16 : 4}, 1, gpu ? DType::kBF16 : DType::kFP64,
                                gpu ? DType::kBF16 : DType::kFP64);
  auto tp = TrimulProblem::random(1, 3, gpu ? 32 : 4, gpu ? 32 : 2, 2,
                                  gpu ? DType::kBF16 : DType::kFP64,
                                  gpu ? DType::kBF16 : DType::kFP64);
  std::vector<HostTensor*> outputs = {&ap.out, &ap.res, &ap.lse, &ap.dq, &ap.dk, &ap.dv,
                                      &ap.dbias, &tp.out, &tp.dz};
  for (auto& g : tp.dw) outputs.push_back(&g);
  for (HostTensor* t : outputs) t->fill(kPoison);
  auto af = ap.fwd();
  auto ab = ap.bwd();
  auto tf = tp.fwd();
  auto tb = tp.bwd();
  c.mutate(af, ab, tf, tb);
  Status st;
  switch (c.entry) {
    case Entry::kRefFwd: st = reference::attention_forward(af); break;
    case Entry::kRefBwd: st = reference::attention_backward(ab); break;
    case Entry::kGpuFwd: st = attention_forward(af, nullptr); break;
    case Entry::kGpuBwd: {
      static char ws[1024];
      st = attention_backward(ab, ws, sizeof(ws), nullptr);
      break;
    }
    case Entry::kTrimulRefFwd: st = reference::trimul_forward(tf); break;
    case Entry::kTrimulRefBwd: st = reference::trimul_backward(tb); break;
    case Entry::kTrimulGpuFwd: st = trimul_forward(tf, nullptr, 0, nullptr); break;
  }
  EXPECT_EQ(st.code(), c.code) << st.message();
  EXPECT_NE(st.message().find(std::string("'") + c.argument + "'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
  for (HostTensor* t : outputs)
    for (double x : t->values()) ASSERT_EQ(x, kPoison) << "an output was written";
}

using AF = AttentionForwardParams;
using AB = AttentionBackwardParams;
using TF = TrimulForwardParams;
using TB = TrimulBackwardParams;
#define ATTN_FWD(body) [](AF& f, AB&, TF&, TB&) { body; }
#define ATTN_BWD(body) [](AF&, AB& b, TF&, TB&) { body; }
#define TRI_FWD(body) [](AF&, AB&, TF& t, TB&) { body; }
#define TRI_BWD(body) [](AF&, AB&, TF&, TB& t) { body; }

const Case kCases[] = {
    {"QWrongRank", Entry::kRefFwd, ATTN_FWD(f.q.rank = 4), "q", "expected rank 5"},
    {"KSequenceMismatch", Entry::kRefFwd, ATTN_FWD(f.k.shape[3] = 6), "k", "expected shape"},
    {"VDtypeMismatch", Entry::kRefFwd, ATTN_FWD(f.v.dtype = DType::kFP32), "v", "expected dtype float64", StatusCode::kInvalidType},
    {"BiasWrongHeads", Entry::kRefFwd, ATTN_FWD(f.bias.shape[2] = 3), "bias", "H=2"},
    {"BiasNotBroadcastOverSlices", Entry::kRefFwd, ATTN_FWD(f.bias.shape[1] = 2), "bias", "expected shape"},
    {"MaskNotBool", Entry::kRefFwd, ATTN_FWD(f.mask.dtype = DType::kFP32), "mask", "bool", StatusCode::kInvalidType},
    {"MaskWrongShape", Entry::kRefFwd, ATTN_FWD(f.mask.shape[4] = 4), "mask", "N=5"},
    {"HeadDimStrideNotOne", Entry::kRefFwd, ATTN_FWD(f.q.stride[4] = 2), "q", "stride must be 1"},
    {"NegativeStride", Entry::kRefFwd, ATTN_FWD(f.k.stride[1] = -5), "k", "negative"},
    {"SizesOverflow", Entry::kRefFwd,
     ATTN_FWD(f.q.shape[0] = int64_t{1} << 40; f.q.stride[0] = int64_t{1} << 40), "q", "overflow"},
    {"NullQuery", Entry::kRefFwd, ATTN_FWD(f.q.data = nullptr), "q", "null"},
    {"EmptySlices", Entry::kRefFwd, ATTN_FWD(f.q.shape[1] = 0), "q", "is empty"},
    {"GpuEmptyKeys", Entry::kGpuFwd, ATTN_FWD(f.k.shape[3] = 0), "k", "is empty"},
    {"TrimulEmpty", Entry::kTrimulRefFwd, TRI_FWD(t.z.shape[1] = t.z.shape[2] = 0), "z", "is empty"},
    {"OutWrongDtype", Entry::kRefFwd, ATTN_FWD(f.out.dtype = DType::kBF16), "out", "expected dtype", StatusCode::kInvalidType},
    {"OutBroadcast", Entry::kRefFwd, ATTN_FWD(f.out.stride[1] = 0), "out", "stride 0"},
    {"ResidualMissing", Entry::kRefFwd, ATTN_FWD(f.out_residual.data = nullptr), "out_residual", "compensate"},
    {"ScaleNotPositive", Entry::kRefFwd, ATTN_FWD(f.scale = -1.0), "scale", "positive"},
    {"GpuHeadDimNotBuilt", Entry::kGpuFwd,
     ATTN_FWD(for (auto* t : {&f.q, &f.k, &f.v, &f.out, &f.out_residual}) t->shape[4] = 24),
     "q", "head dim D=24"},
    {"GpuRejectsFloat64", Entry::kGpuFwd,
     ATTN_FWD(for (auto* t : {&f.q, &f.k, &f.v, &f.out, &f.out_residual}) t->dtype = DType::kFP64),
     "q", "bfloat16 or float16", StatusCode::kInvalidType},
    {"GpuMisalignedPointer", Entry::kGpuFwd,
     ATTN_FWD(f.k.data = static_cast<char*>(f.k.data) + 2), "k", "16-byte aligned"},
    {"GpuStrideNotVectorMultiple", Entry::kGpuFwd, ATTN_FWD(f.v.stride[3] = 17), "v", "multiple of 8"},
    // 4 rows of 2^24 fit 31 bits, but the kernels also form offsets of a last tile's rows past N.
    {"GpuSliceExtentWithTileRows", Entry::kGpuFwd, ATTN_FWD(f.k.stride[3] = int64_t{1} << 24), "k",
     "2^31 elements", StatusCode::kUnsupported},
    {"GpuNeedsLse", Entry::kGpuFwd, ATTN_FWD(f.lse.data = nullptr), "lse", "null"},
    {"GpuBiasDtype", Entry::kGpuFwd, ATTN_FWD(f.bias.dtype = DType::kFP16), "bias", "bfloat16 or float32", StatusCode::kInvalidType},
    {"BwdDoutShape", Entry::kRefBwd, ATTN_BWD(b.dout.shape[2] = 1), "dout", "H=2"},
    {"BwdDbiasDtype", Entry::kRefBwd, ATTN_BWD(b.dbias.dtype = DType::kFP32), "dbias", "float64", StatusCode::kInvalidType},
    {"GpuBwdDeltaShape", Entry::kGpuBwd, ATTN_BWD(b.delta = b.lse; b.delta.shape[2] = 1), "delta", "H=2"},
    {"GpuBwdDeltaContiguous", Entry::kGpuBwd, ATTN_BWD(b.delta = b.lse; b.delta.stride[2] = 7), "delta", "contiguous"},
    {"BwdDqDtype", Entry::kRefBwd, ATTN_BWD(b.dq.dtype = DType::kFP16), "dq", "expected dtype", StatusCode::kInvalidType},
    {"GpuBwdWorkspaceTooSmall", Entry::kGpuBwd, ATTN_BWD((void)b), "workspace", "bytes",
     StatusCode::kWorkspaceTooSmall},
    {"GpuBwdDkStride", Entry::kGpuBwd, ATTN_BWD(b.dk.stride[4] = 3), "dk", "stride must be 1"},
    {"TrimulZNotSquare", Entry::kTrimulRefFwd, TRI_FWD(t.z.shape[2] = 4), "z", "square"},
    {"TrimulPInOdd", Entry::kTrimulRefFwd, TRI_FWD(t.w.p_in_weight.shape[0] = 3), "p_in_weight", "even"},
    {"TrimulGInShape", Entry::kTrimulRefFwd, TRI_FWD(t.w.g_in_weight.shape[1] = 5), "g_in_weight", "C=4"},
    {"TrimulNormOutShape", Entry::kTrimulRefFwd, TRI_FWD(t.w.norm_out_weight.shape[0] = 4), "norm_out_weight", "Ch=2"},
    {"TrimulMaskShape", Entry::kTrimulRefFwd, TRI_FWD(t.mask.rank = 4), "mask", "rank 3"},
    {"TrimulEps", Entry::kTrimulRefFwd, TRI_FWD(t.eps = 0.0), "eps", "positive"},
    {"TrimulOutDtype", Entry::kTrimulRefFwd, TRI_FWD(t.out.dtype = DType::kFP32), "out", "float64", StatusCode::kInvalidType},
    {"TrimulGpuChannels", Entry::kTrimulGpuFwd,
     TRI_FWD(t.z.shape[3] = 48; t.w.p_in_weight.shape[1] = 48), "z", "C=48"},
    {"TrimulGradForAbsentBias", Entry::kTrimulRefBwd, TRI_BWD(t.fwd.w.p_in_bias = TensorView{}),
     "d_p_in_bias", "weight is absent"},
    {"TrimulDzShape", Entry::kTrimulRefBwd, TRI_BWD(t.dz.shape[1] = 2), "dz", "expected shape"},
    {"TrimulScaleWithoutResidual", Entry::kTrimulRefFwd, TRI_FWD(t.scale = t.out), "scale", "residual update only"},
    {"TrimulGpuResidualDtype", Entry::kTrimulGpuFwd, TRI_FWD(t.residual = t.z; t.residual.dtype = DType::kFP16),
     "residual", "expected dtype float32 or bfloat16", StatusCode::kInvalidType},
    {"TrimulGpuScaleChannelStride", Entry::kTrimulGpuFwd, TRI_FWD(t.residual = t.z; t.scale = t.z; t.scale.stride[3] = 2),
     "scale", "channel stride", StatusCode::kUnsupported},
    {"TrimulResidualNotContiguous", Entry::kTrimulRefFwd, TRI_FWD(t.residual = t.out; t.residual.stride[1] = 0),
     "residual", "contiguous"},
};

INSTANTIATE_TEST_SUITE_P(Arguments, Rejects, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(Validation, ValidProblemsPass) {
  auto ap = AttnProblem::random({1, 2, 2, 5, 16}, 3, DType::kBF16, DType::kFP32);
  EXPECT_TRUE(validate_attention_forward(ap.fwd(), true).ok());
  EXPECT_TRUE(validate_attention_backward(ap.bwd(), true).ok());
  size_t bytes = 0;
  EXPECT_TRUE(attention_backward_workspace_size(ap.bwd(), &bytes).ok());
  EXPECT_GT(bytes, 0u);
  auto tp = TrimulProblem::random(1, 3, 32, 64, 4, DType::kBF16, DType::kFP32);
  EXPECT_TRUE(validate_trimul_forward(tp.fwd(), true).ok());
  EXPECT_TRUE(validate_trimul_backward(tp.bwd(), true).ok());
  tp.add_residual(DType::kFP32, DType::kBF16, 5);  // fp32 residual, out and dout; broadcast scale
  EXPECT_TRUE(validate_trimul_forward(tp.fwd(), true).ok());
  EXPECT_TRUE(validate_trimul_backward(tp.bwd(), true).ok());
}

TEST(Validation, GpuEntryWithoutDeviceReportsItPlainly) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  auto ap = AttnProblem::random({1, 2, 2, 5, 16}, 5, DType::kBF16, DType::kBF16);
  const Status st = attention_forward(ap.fwd(), nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'q'"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tpf::test
