// The two-pass attention backward's plan (CPU): its slice chunks cover every slice with none
// empty, give at least half kBwdTargetBlocks blocks where there are slices enough, and fit the
// workspace the API asks for.
#include <gtest/gtest.h>

#include <algorithm>

#include "attention/kernels.h"
#include "attention/tile_config.h"
#include "testing/gpu_attention.h"

namespace tpf::attn {
namespace {

void expect_chunks(int S, int chunks, int slices, int64_t blocks_per_chunk, const char* pass) {
  SCOPED_TRACE(pass);
  EXPECT_GE(chunks, 1);
  EXPECT_LE(chunks, S);
  EXPECT_GE(int64_t{chunks} * slices, S);        // every slice in a chunk
  EXPECT_LT(int64_t{chunks - 1} * slices, S);    // no empty chunk (its blocks would return early)
  // Equal chunks of whole slices: at least half the target (slices a chunk rounded up), or a
  // chunk a slice.
  EXPECT_GE(2 * blocks_per_chunk * chunks, std::min<int64_t>(kBwdTargetBlocks, 2 * blocks_per_chunk * S));
}

TEST(TwoPassPlan, ChunksCoverEverySliceAndFillTheGpu) {
  for (int B : {1, 2})
    for (int H : {1, 4})
      for (int S : {1, 7, 200, 768})
        for (int N : {1, 8, 100, 128, 129, 768, 4096}) {
          SCOPED_TRACE("B " + std::to_string(B) + " H " + std::to_string(H) + " S " + std::to_string(S) +
                       " N " + std::to_string(N));
          const TwoPassPlan p = plan_two_pass({B, S, H, N});
          EXPECT_EQ(p.key_tiles, (N + 127) / 128);
          EXPECT_EQ(p.n_pad, p.key_tiles * 128);
          const int64_t bh = int64_t{B} * H;
          expect_chunks(S, p.chunks1, p.slices1, bh * p.key_tiles, "pass 1");
          expect_chunks(S, p.chunks2, p.slices2, bh * p.key_tiles * p.key_tiles, "pass 2");
        }
}

// The chunk counts docs/attention-design.md quotes for N = 768, H = 4, S = N: pass 1 22 chunks
// (528 blocks, four full waves), pass 2 9 (1296 blocks, 98% of ten waves, the fewest within 2%
// of the best fill).
TEST(TwoPassPlan, ChunksAtTheDocumentedSize) {
  const TwoPassPlan p = plan_two_pass({1, 768, 4, 768});
  EXPECT_EQ(p.key_tiles, 6);
  EXPECT_EQ(p.chunks1, 22);
  EXPECT_EQ(p.slices1, 35);
  EXPECT_EQ(p.chunks2, 9);
  EXPECT_EQ(p.slices2, 86);
}

// At the Pairformer's sizes (B = 1, H = 4, S = N) the two-pass dbias partials take no more room
// than backward.cu's, so the workspace, the larger of the two, does not grow with the two-pass
// backward. N = 512 took 35 chunks (140 MiB) under a rule of last-wave fill.
TEST(TwoPassPlan, PartialsWithinTheOnePassBackwardsAtPairformerSizes) {
  for (int N : {256, 384, 512, 640, 768, 1024}) {
    SCOPED_TRACE("N " + std::to_string(N));
    const Dims d{1, N, 4, N};
    const TwoPassPlan p = plan_two_pass(d);
    const BwdPlan one = plan_backward(d, 32);
    EXPECT_LE(int64_t{p.chunks2} * p.n_pad * p.n_pad, int64_t{one.chunks} * one.part_rows * one.part_cols);
  }
  EXPECT_EQ(plan_two_pass({1, 512, 4, 512}).chunks2, 10);
}
TEST(TwoPassPlan, WorkspaceHoldsItsBuffers) {
  const int64_t B = 1, S = 3, H = 2, N = 136, D = 32;  // the two-pass partials (256 x 256) outgrow the others (192 x 192)
  auto ap = test::AttnProblem::random({B, S, H, N, D}, 5, DType::kBF16, DType::kBF16);
  size_t bytes = 0;
  ASSERT_TRUE(attention_backward_workspace_size(ap.bwd(), &bytes).ok());
  const TwoPassPlan p = plan_two_pass({int(B), int(S), int(H), int(N)});
  // dQ sums, Dlt, LSE log2(e), the turn counters (two query halves a tile), the dbias partials
  const int64_t need = 4 * (B * S * H * N * D + 2 * B * S * H * N + B * H * S * p.key_tiles * 2 +
                            int64_t{p.chunks2} * B * H * p.n_pad * p.n_pad);
  EXPECT_GE(static_cast<int64_t>(bytes), need);
}

}  // namespace
}  // namespace tpf::attn
