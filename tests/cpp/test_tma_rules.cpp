// The host-side rules that decide whether a tensor can be loaded by TMA (common/tma.h); the
// kernels fall back to cp.async where they say no, so a rule that says yes wrongly would make
// the driver reject the map or the copy read the wrong bytes.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/tma.h"

namespace tpf::detail {
namespace {

// A [B=1, S=4, N=768, H=4, D=32] bf16 tensor in the [B,S,N,H,D] layout, tiles of 128 rows x D.
TmaTile slice_tile() {
  TmaTile t;
  t.rank = 5;
  const uint64_t dims[5] = {32, 768, 4, 4, 1};
  const uint64_t strides[4] = {4 * 32 * 2, 32 * 2, 768 * 4 * 32 * 2, 16};  // n, h, s, b (size 1)
  const uint32_t box[5] = {32, 128, 1, 1, 1};
  for (int i = 0; i < 5; ++i) t.dims[i] = dims[i], t.box[i] = box[i];
  for (int i = 0; i < 4; ++i) t.strides[i] = strides[i];
  return t;
}

alignas(64) unsigned char buffer[256];

TEST(TmaRules, AcceptsAnAlignedSliceTile) { EXPECT_TRUE(tma_tile_ok(buffer, 2, slice_tile())); }

TEST(TmaRules, RejectsABaseNotOn16Bytes) { EXPECT_FALSE(tma_tile_ok(buffer + 2, 2, slice_tile())); }

TEST(TmaRules, RejectsStridesNotMultiplesOf16Bytes) {
  TmaTile t = slice_tile();
  t.strides[0] = 200;  // a 16-bit bias row of N = 100 keys
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
  t = slice_tile();
  t.strides[2] = 0;  // a broadcast slice dimension
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
}

TEST(TmaRules, RejectsBoxesTheHardwareCannotMove) {
  TmaTile t = slice_tile();
  t.box[1] = 257;
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
  t = slice_tile();
  t.box[0] = 4;  // 8-byte box rows
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
  EXPECT_TRUE(tma_tile_ok(buffer, 4, t));  // the same box of fp32: 16-byte rows
}

TEST(TmaRules, RejectsRanksAndSizesOutOfRange) {
  TmaTile t = slice_tile();
  t.rank = 6;
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
  t.rank = 0;
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
  t = slice_tile();
  t.dims[1] = (uint64_t{1} << 32) + 1;
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
  t = slice_tile();
  t.dims[2] = 0;
  EXPECT_FALSE(tma_tile_ok(buffer, 2, t));
}

// The forward's bias tiles (attention/tma_maps.cpp): 128 bytes of keys x 64 query rows of a
// [B, 1, H, N, N] bias, coordinates (key, query, h, b).
TmaTile bias_tile(uint64_t n, int elem_bytes) {
  TmaTile t;
  t.rank = 4;
  const uint64_t dims[4] = {n, n, 4, 1};
  const uint64_t strides[3] = {n * elem_bytes, n * n * elem_bytes, 16};  // q, h, b (size 1)
  const uint32_t box[4] = {static_cast<uint32_t>(128 / elem_bytes), 64, 1, 1};
  for (int i = 0; i < 4; ++i) t.dims[i] = dims[i], t.box[i] = box[i];
  for (int i = 0; i < 3; ++i) t.strides[i] = strides[i];
  return t;
}

TEST(TmaRules, BiasRowsMustBeWhole16ByteChunks) {
  EXPECT_TRUE(tma_tile_ok(buffer, 2, bias_tile(768, 2)));
  EXPECT_TRUE(tma_tile_ok(buffer, 4, bias_tile(768, 4)));
  EXPECT_TRUE(tma_tile_ok(buffer, 4, bias_tile(100, 4)));   // fp32: N a multiple of 4 will do
  EXPECT_FALSE(tma_tile_ok(buffer, 2, bias_tile(100, 2)));  // 16-bit: N must be a multiple of 8
  EXPECT_FALSE(tma_tile_ok(buffer, 4, bias_tile(7, 4)));
}

TEST(TmaRules, AcceptsTheD16And64SliceTiles) {
  for (uint32_t d : {16u, 64u}) {
    TmaTile t = slice_tile();
    t.dims[0] = t.box[0] = d;
    t.strides[0] = 4 * d * 2, t.strides[2] = 768 * 4 * d * 2;  // [B,S,N,H,D]: n, s strides
    EXPECT_TRUE(tma_tile_ok(buffer, 2, t)) << d;
  }
}

}  // namespace
}  // namespace tpf::detail
