// Thin PTX wrappers for the warp-level tensor-core path (mma.sync m16n8k16, ldmatrix, cp.async)
// and the math helpers the kernels share. Fragment layouts follow the PTX ISA:
//   C/D m16n8 (fp32): c0,c1 at (row g, cols 2t,2t+1), c2,c3 at (row g+8, same cols)
//   A m16k16: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
//   B k16n8:  b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g)
// with g = lane / 4 and t = lane % 4.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace tpf::dev {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy of which the first `src_bytes` (0..16) are read and the rest
// written as zeros (tile edges), to a shared-window address (precomputed by the caller).
__device__ __forceinline__ void cp_async_16_part(uint32_t smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
// The same, whole or nothing: `valid == false` writes zeros (out-of-range rows).
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  cp_async_16_part(smem, gmem, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  cp_async_16(smem_addr(smem), gmem, valid);
}
// The same, always all 16 bytes.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
// 4-byte global->shared copy (cached in L1); `valid == false` writes zero.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// A hint: the 128-byte line holding p toward L2 (no register or ordering effect).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
// The copies landed: "memory" keeps the compiler from moving shared-memory reads above the wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8 x 8 16-bit matrices (lane 8i + j: the address of row j of matrix i), from a
// shared-window byte address (precomputed per lane, plus constants) or a pointer.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  ldmatrix_x4(r, smem_addr(smem));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  ldmatrix_x4_trans(r, smem_addr(smem));
}

// Four 8 x 8 16-bit matrices from C-fragment layout (register i: matrix i, thread (g, t) holding
// row g, columns 2t and 2t + 1) into shared memory: lane 8i + j gives the address of row j of
// matrix i (16 bytes). sm_90.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n"
               :
               : "r"(smem), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// Four 8 x 8 16-bit matrices from C-fragment layout (register i: matrix i, thread (g, t) holding
// row g, columns 2t and 2t + 1) into shared memory transposed: lane 8i + j gives the address of
// row j of matrix i's transpose (16 bytes: column j of the fragment matrix). sm_90.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
               :
               : "r"(smem), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

template <class T>
struct MmaOp;

template <>
struct MmaOp<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct MmaOp<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// c0 += a b[0..1] and c1 += a b[2..3]: the two n8 tiles of B that one ldmatrix.x4 delivers
// (matrices 0, 1: the first tile's k halves; 2, 3: the second's).
template <class T>
__device__ __forceinline__ void mma_n16(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[4]) {
  MmaOp<T>::run(c0, a, b[0], b[1]);
  MmaOp<T>::run(c1, a, b[2], b[3]);
}

// Two accumulator n-tiles (16 columns) of an m16n8 C fragment, as one m16k16 A fragment.
template <class T>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = MmaOp<T>::pack(lo[0], lo[1]);
  a[1] = MmaOp<T>::pack(lo[2], lo[3]);
  a[2] = MmaOp<T>::pack(hi[0], hi[1]);
  a[3] = MmaOp<T>::pack(hi[2], hi[3]);
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float(float x) { return x; }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ float from_float(float x) { return x; }

// B fragment (k16 x n8) of a scaled doubled identity: B[k][n] = c_hi where k == n, c_lo where
// k == n + 8, else 0, with c_hi = T(c) and c_lo = T(c - c_hi). Against A = {x0, x1, x0, x1} (the
// m16 x k8 A fragment of a matrix X written twice along k) one MMA adds (c_hi + c_lo) X, that is
// c X to about 16 bits of c, each product exact. The zero entries of B multiply X too, so X must
// be finite (0 * inf is NaN).
template <class T>
__device__ __forceinline__ void scaled_identity_b(uint32_t (&b)[2], float c, int lane) {
  const int g = lane / 4, t = lane % 4;
  const float hi = to_float(from_float<T>(c)), lo = c - hi;
  b[0] = MmaOp<T>::pack(2 * t == g ? hi : 0.f, 2 * t + 1 == g ? hi : 0.f);
  b[1] = MmaOp<T>::pack(2 * t == g ? lo : 0.f, 2 * t + 1 == g ? lo : 0.f);
}

// Two packed 16-bit values (low = first) as floats.
template <class T>
__device__ __forceinline__ float2 pair_to_float2(uint32_t v);
template <>
__device__ __forceinline__ float2 pair_to_float2<__nv_bfloat16>(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 pair_to_float2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// Eight 16-bit values (16 bytes, first value lowest) to and from floats.
template <class T>
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(MmaOp<T>::pack(v[0], v[1]), MmaOp<T>::pack(v[2], v[3]), MmaOp<T>::pack(v[4], v[5]),
                    MmaOp<T>::pack(v[6], v[7]));
}
template <class T>
__device__ __forceinline__ void unpack8(float (&v)[8], uint4 q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = pair_to_float2<T>(w[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

// Release/acquire on a 32-bit flag at GPU scope (the ordered dQ reduction's turn counter).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace tpf::dev
