// Thin PTX wrappers for Hopper's warpgroup tensor-core path (wgmma, sm_90a): shared-memory
// matrix descriptors, the fences around an asynchronous batch, m64n128k16 with fp32
// accumulation for bf16 / fp16 operands read from shared memory, and m64n32k16 with A from
// registers (PTX ISA 9.7.15).
//
// Accumulator layout (per thread of the warpgroup, warp w = warp % 4, g = lane / 4,
// t = lane % 4): d[4i + 0, 1] at (row 16w + g, cols 8i + 2t, +1), d[4i + 2, 3] at row + 8.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

namespace tpf::dev {

// Swizzle modes of a descriptor: rows of 128, 64 or 32 bytes whose 16-byte chunks are XORed
// with address bits [9:7], [8:7] or [7]: common/swizzle.cuh's tiles with rows of 64, 32 or 16
// 16-bit elements, placed at a multiple of the pattern's period (1024, 512, 256 bytes).
enum class Swizzle : uint64_t { k128B = 1, k64B = 2, k32B = 3 };

// Descriptor of a swizzled operand tile at shared address `addr` (pattern-aligned: base offset
// 0). lbo / sbo in bytes: K-major: sbo = distance of 8-row groups (lbo unused); MN-major: lbo =
// distance of MN blocks (one swizzle row wide), sbo = of 8-row K groups.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                               Swizzle mode = Swizzle::k128B) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (static_cast<uint64_t>(mode) << 62);
}

// Descriptor of a tile with rows of 32 16-bit elements (64 bytes) in the 64-byte swizzle
// (common/swizzle.cuh's tile_at<32>), starting on its 512-byte period: 8-row groups are 512 bytes
// apart; as one MN block when MN-major (N = 32), lbo unused. A k16 step adds 32 bytes along a row
// (K-major: + 2 to the descriptor) or 16 rows (MN-major: + 64).
__device__ __forceinline__ uint64_t wgmma_desc_rows32(uint32_t addr) {
  return wgmma_desc(addr, 16, 512, Swizzle::k64B);
}

// The descriptor of the tile `bytes` further on: the start address is its low 14 bits in
// 16-byte units, and every shared address of a block (< 228 KB) fits them, so the sum cannot
// carry into the other fields. A loop then adds an offset (one 64-bit add) instead of
// rebuilding the descriptor from an address (four uniform instructions per wgmma).
__device__ __forceinline__ uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Keeps the compiler from moving accumulator reads or writes across the asynchronous batch.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (+)= A B for a 64 x 128 x 16 step; kTransA / kTransB: the operand is MN-major in shared
// memory (else K-major). scale_d == 0 ignores D's old value.
#define TPF_WGMMA_M64N128K16(TYPE)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                     \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                  \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                                                                      \
               "%64, %65, p, 1, 1, %67, %68;\n}\n"                                              \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                            \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))

template <class T, int kTransA, int kTransB>
struct Wgmma;
template <int kTransA, int kTransB>
struct Wgmma<__nv_bfloat16, kTransA, kTransB> {
  __device__ __forceinline__ static void run(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    TPF_WGMMA_M64N128K16("bf16");
  }
};
template <int kTransA, int kTransB>
struct Wgmma<__half, kTransA, kTransB> {
  __device__ __forceinline__ static void run(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    TPF_WGMMA_M64N128K16("f16");
  }
};
#undef TPF_WGMMA_M64N128K16

// D (+)= A B for a 64 x 32 x 16 step with A from registers (each warp's 16 rows as an
// m16n8k16 A fragment) and B from shared memory (kTransB: MN-major). The registers of A must
// not change until the batch is waited for.
#define TPF_WGMMA_M64N32K16_RS(TYPE)                                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                     \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " "                   \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "       \
               "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"                                  \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),      \
                 "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB))

template <class T, int kTransB>
struct WgmmaN32RS;
template <int kTransB>
struct WgmmaN32RS<__nv_bfloat16, kTransB> {
  __device__ __forceinline__ static void run(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    TPF_WGMMA_M64N32K16_RS("bf16");
  }
};
template <int kTransB>
struct WgmmaN32RS<__half, kTransB> {
  __device__ __forceinline__ static void run(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    TPF_WGMMA_M64N32K16_RS("f16");
  }
};
#undef TPF_WGMMA_M64N32K16_RS

// D (+)= A B for a 64 x 128 x 16 step with A from registers (each warp's 16 rows as an
// m16n8k16 A fragment, common/mma.cuh's acc_to_a) and B from shared memory (kTransB:
// MN-major): the fused transition's projections whose A is computed in registers.
#define TPF_WGMMA_M64N128K16_RS(TYPE)                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                     \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                  \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                 \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB))

template <int kTransB>
struct WgmmaN128RS {
  __device__ __forceinline__ static void run(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    TPF_WGMMA_M64N128K16_RS("bf16");
  }
};
#undef TPF_WGMMA_M64N128K16_RS

// D (+)= A B, both operands from shared memory, for 64 x N x 16 steps with N = 64 (32
// accumulators) or 32 (16): the attention backward's S^T, dP^T (and dQ, which measured slower).
#define TPF_WGMMA_M64N64K16_SS(TYPE) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "%32, %33, p, 1, 1, %35, %36;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))
#define TPF_WGMMA_M64N32K16_SS(TYPE) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
               "%16, %17, p, 1, 1, %19, %20;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))

template <class T, int N, int kTransA, int kTransB>
struct WgmmaSS {
  static_assert(N == 64 || N == 32, "the shapes wrapped here");
  __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    constexpr bool kHalf = std::is_same_v<T, __half>;
    if constexpr (N == 64 && kHalf) TPF_WGMMA_M64N64K16_SS("f16");
    if constexpr (N == 64 && !kHalf) TPF_WGMMA_M64N64K16_SS("bf16");
    if constexpr (N == 32 && kHalf) TPF_WGMMA_M64N32K16_SS("f16");
    if constexpr (N == 32 && !kHalf) TPF_WGMMA_M64N32K16_SS("bf16");
  }
};
#undef TPF_WGMMA_M64N64K16_SS
#undef TPF_WGMMA_M64N32K16_SS

}  // namespace tpf::dev
