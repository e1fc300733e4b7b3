// Shared device helpers of the tensor-core kernels (forward and weight backward, fp16 / bf16) and the
// narrow-layer kernel: element-type traits with the mma.sync m16n8k16 wrappers, cp.async / ldmatrix
// PTX helpers, and the p4 group transform. Everything is in an anonymous namespace: each kernel file
// has its own copy.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "eq_elem_convert.cuh"
#include "eq_p4_transform.cuh"

namespace flash_eqlinear {
namespace {

// ---- element-type traits -------------------------------------------------------------------
template <class T> struct Elem;

template <> struct Elem<__half> {
  using H2 = __half2;
  static constexpr bool kHalve = true;  // prologue computes f / 2 (fp16 range)
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <> struct Elem<__nv_bfloat16> {
  using H2 = __nv_bfloat162;
  static constexpr bool kHalve = false;
  // bf16 -> FP32 is exact: the 16 bits moved into the upper half, one integer instruction per value
  // (the intrinsic's half extraction compiled to ~1.5)
  static __device__ __forceinline__ float2 unpack(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- PTX helpers -----------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 8-byte async copy (general path); src_bytes = 0 zero-fills without reading src.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// 16-byte async copy, or 16 zero bytes when !pred (src-size 0: nothing is read; src is then
// redirected to a valid address anyway so no out-of-range pointer reaches the memory system).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, const void* safe,
                                                 bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(pred ? src : safe), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Transposing ldmatrix: lane (gid, tid4) of matrix j receives the elements (2 tid4, gid) and
// (2 tid4 + 1, gid) of the 8 x 8 matrix whose rows are the 16-byte rows addressed by lanes 8j..8j+7.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v));
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]));
}

// One LDS.128 worth of raw x (channels k, k+1 of one row) -> packed (k, k+1) A registers of the
// four planes.
template <class T>
__device__ __forceinline__ void xform(const uint4 v, uint32_t& F0, uint32_t& FR, uint32_t& FI,
                                      uint32_t& F2) {
  constexpr bool kHalve = Elem<T>::kHalve;
  const float2 a = Elem<T>::unpack(v.x), b = Elem<T>::unpack(v.y);  // channel k
  const float2 e = Elem<T>::unpack(v.z), g = Elem<T>::unpack(v.w);  // channel k+1
  float f0a, fra, fia, f2a, f0b, frb, fib, f2b;
  dft4<kHalve>(a.x, a.y, b.x, b.y, f0a, fra, fia, f2a);
  dft4<kHalve>(e.x, e.y, g.x, g.y, f0b, frb, fib, f2b);
  F0 = Elem<T>::pack(f0a, f0b);
  FR = Elem<T>::pack(fra, frb);
  FI = Elem<T>::pack(fia, fib);
  F2 = Elem<T>::pack(f2a, f2b);
}

// xform in packed 16-bit arithmetic (about half the instructions): the same values, except that
// f0 and f2 are rounded twice (after x0 + x2 and x1 + x3, then after their sum / difference) instead
// of once. fp16 keeps the halving (x/2 products are exact).
template <class T>
__device__ __forceinline__ void xform_h2(const uint4 v, uint32_t& F0, uint32_t& FR, uint32_t& FI, uint32_t& F2) {
  using H2 = typename Elem<T>::H2;
  const auto h2 = [](uint32_t u) { return *reinterpret_cast<const H2*>(&u); };
  const auto u32 = [](H2 h) { return *reinterpret_cast<const uint32_t*>(&h); };
  // (channel k, channel k+1) pairs of each group value: low / high halves of the two channel words.
  const H2 x0 = h2(__byte_perm(v.x, v.z, 0x5410)), x1 = h2(__byte_perm(v.x, v.z, 0x7632));
  const H2 x2 = h2(__byte_perm(v.y, v.w, 0x5410)), x3 = h2(__byte_perm(v.y, v.w, 0x7632));
  if constexpr (Elem<T>::kHalve) {
    const H2 half = __float2half2_rn(0.5f), mhalf = __float2half2_rn(-0.5f);
    const H2 u = __hmul2(x0, half), w = __hmul2(x3, half);
    FR = u32(__hfma2(x2, mhalf, u));
    FI = u32(__hfma2(x1, mhalf, w));
    const H2 s02 = __hfma2(x2, half, u), s13 = __hfma2(x1, half, w);
    F0 = u32(__hadd2(s02, s13));
    F2 = u32(__hsub2(s02, s13));
  } else {
    FR = u32(__hsub2(x0, x2));
    FI = u32(__hsub2(x3, x1));
    const H2 s02 = __hadd2(x0, x2), s13 = __hadd2(x1, x3);
    F0 = u32(__hadd2(s02, s13));
    F2 = u32(__hsub2(s02, s13));
  }
}

// Epilogue of one (row, output channel): y0..y3 from the accumulators (a0, a2, aR, aI) + bias b,
// packed as (y0, y1), (y2, y3); halved accumulators after the fp16 prologue.
template <class T>
__device__ __forceinline__ void inverse_dft4(float a0, float a2, float ar, float ai, float b, uint32_t& y01,
                                             uint32_t& y23) {
  const float4 y = inverse_dft4_f32<Elem<T>::kHalve>(a0, a2, ar, ai, b);
  y01 = Elem<T>::pack(y.x, y.y);
  y23 = Elem<T>::pack(y.z, y.w);
}

// GELU, exact (erf) form, in FP32: GELU(v) = v Phi(v). (The forward kernels' GELU epilogues.)
template <int = 0>
__device__ __forceinline__ float gelu_f32(float v) {
  return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
}

// GELU of a packed pair of 16-bit values (the rounded output), rounded again: what GELU applied to the
// stored layer output computes.
template <class T>
__device__ __forceinline__ uint32_t gelu_pair(uint32_t u) {
  const float2 v = Elem<T>::unpack(u);
  return Elem<T>::pack(gelu_f32(v.x), gelu_f32(v.y));
}

// Block order for L2 reuse: consecutive linear block ids sweep all num_n d tiles of a group of
// `group` M tiles (default kGroupM), so the blocks resident at once share a few x panels and plane
// tiles.
constexpr int kGroupM = 8;
// (I: int64_t, or int where the host bounds the tile count: 32-bit divisions are far cheaper.)
template <class I>
__device__ __forceinline__ void grouped_tile(I lin, I num_m, I num_n, I& m_tile, I& n_tile, I group = kGroupM) {
  const I span = group * num_n;
  const I grp = lin / span, rem = lin - grp * span;
  const I first_m = grp * group;
  const I gsz = min(num_m - first_m, group);
  m_tile = first_m + rem % gsz;
  n_tile = rem / gsz;
}

}  // namespace
}  // namespace flash_eqlinear
