// Hopper (sm_90a) PTX helpers: wgmma.mma_async m64n64 (k16 fp16 / bf16, k8 TF32) with A from
// registers and B from shared memory (K-major), its fence / commit / wait wrappers, mbarriers, TMA
// (bulk tensor) loads, and the cluster helpers (rank, peer addresses, remote arrivals, barrier).
//
// Register A (per warp of the warpgroup: rows 16 w .. 16 w + 15) has exactly the mma.sync m16n8k16
// A fragment layout, and the FP32 accumulator d[j][0..3] of n8 block j the m16n8 C layout, so the
// tensor-core kernels build fragments and run their epilogues the same way for both instructions.
//
// B descriptor, K-major with the 64-byte swizzle (what a TMA load with CU_TENSOR_MAP_SWIZZLE_64B
// writes for 64-byte rows): rows of 32 k values, 8-row groups of 512 bytes (SBO), the group base
// 512-byte aligned; a k16 step inside the row is a +32-byte start address (the hardware applies the
// same XOR pattern as the TMA write). LBO is unused for swizzled K-major layouts.
//
// Everything compiles for every target; the instructions exist only when compiling for sm_90a
// (__CUDA_ARCH_FEAT_SM90_ALL). Elsewhere the wrappers trap: the host launches the kernels that use
// them only on sm_90 devices, from a binary that contains sm_90a code.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace flash_eqlinear {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_EQLINEAR_WGMMA 1
#endif

__device__ __forceinline__ uint64_t wgmma_desc_sw64(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(512 >> 4) << 32) |
         (uint64_t(2) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Warpgroup register budget (sm_90a): the producer gives registers back, the consumers take them.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Keeps registers that an in-flight wgmma reads or writes pinned in place until this point (the
// compiler must not reuse or move them before the wait that retires the wgmma).
__device__ __forceinline__ void reg_fence(uint32_t (&r)[4]) {
  asm volatile("" : "+r"(r[0]), "+r"(r[1]), "+r"(r[2]), "+r"(r[3])::"memory");
}
__device__ __forceinline__ void reg_fence(float (&d)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

// The four m64n64 FP32 accumulator sets of the fused kernels, zeroed.
__device__ __forceinline__ void zero_acc(float (&acc)[4][8][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[s][j][r] = 0.f;
}

// Waits for every wgmma group in flight; the accumulators and both A fragment buffers stay pinned
// until then.
__device__ __forceinline__ void wgmma_retire_all(float (&acc)[4][8][4], uint32_t (&fa)[2][4][4]) {
  wgmma_wait<0>();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    reg_fence(acc[s]);
    reg_fence(fa[0][s]);
    reg_fence(fa[1][s]);
  }
}

#define FLASH_EQLINEAR_WGMMA_D                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASH_EQLINEAR_WGMMA_D_OPS(d)                                                              \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),        \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),    \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),    \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),    \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),    \
      "+f"(d[7][2]), "+f"(d[7][3])

// d (64 x 64 per warpgroup, FP32) += kScaleA * A (registers) * B (descriptor), one k step of 32 bytes
// per row: k16 for fp16 / bf16, k8 for float (TF32: the tensor cores read the top 19 bits; A is
// rounded to TF32 by the caller). The TF32 A fragment (a0..a3 = rows r, r + 8 at k = t, then at
// k = t + 4) has the 16-bit one's (row, 16-byte k chunk) structure, so callers build both alike.
template <class T, int kScaleA>
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(kScaleA == 1 || kScaleA == -1, "imm-scale-a is +1 or -1");
#ifdef FLASH_EQLINEAR_WGMMA
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FLASH_EQLINEAR_WGMMA_D
                 ", {%32, %33, %34, %35}, %36, p, %38, 1, 0;\n}\n"
                 : FLASH_EQLINEAR_WGMMA_D_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kScaleA));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FLASH_EQLINEAR_WGMMA_D
                 ", {%32, %33, %34, %35}, %36, p, %38, 1, 0;\n}\n"
                 : FLASH_EQLINEAR_WGMMA_D_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kScaleA));
  } else {
    static_assert(std::is_same_v<T, float>, "fp16, bf16 or float (TF32)");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " FLASH_EQLINEAR_WGMMA_D
                 ", {%32, %33, %34, %35}, %36, p, %38, 1;\n}\n"
                 : FLASH_EQLINEAR_WGMMA_D_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kScaleA));
  }
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}
#undef FLASH_EQLINEAR_WGMMA_D
#undef FLASH_EQLINEAR_WGMMA_D_OPS

// ---- mbarriers (shared::cta, 64-bit) and TMA loads completing on them ----------------------------
// Plain sm_90 PTX, but only the sm_90a kernels use them: guarded like the wgmma wrappers.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Orders this thread's earlier shared-memory writes (generic proxy) before later reads by the async
// proxy (wgmma operands written with st.shared): before the arrival that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Makes the initialised barriers visible to the async proxy (the TMA unit) before first use.
__device__ __forceinline__ void mbar_fence_init() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// The producer's arrival, announcing the bytes the TMA loads of this phase will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Blocks until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nWAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_AGAIN;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

__device__ __forceinline__ void tma_prefetch_desc(const void* tmap) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#endif
}
// Box at (c0, c1[, c2]) (innermost first, in elements) of the tensor map -> shared memory, completing
// on bar. Out-of-range elements arrive as zeros and count towards the transaction bytes.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
// Multicast form: the box lands at dst's offset in each CTA of the cluster named in ctas (a bit mask of
// ranks), and its bytes complete on the barrier at bar's offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar,
                                                      uint16_t ctas) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar), "h"(ctas)
      : "memory");
#endif
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, int c0, int c1, int c2, uint32_t bar) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}

// ---- clusters -----------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
// The shared::cluster address of shared-memory address addr (of this CTA's layout) in CTA rank.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t r = addr;
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
#endif
  return r;
}
// An arrival on a barrier of another CTA of the cluster (address from cluster_map). Default
// semantics: the arriving warp's shared-memory reads have completed, which is all a "stage read"
// release needs (a cluster-scope release would fence every arrival).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_bar) {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
#endif
}
// The `threads` threads (a multiple of 32) that reach named barrier `id` (1..15; 0 is __syncthreads'),
// with their shared-memory accesses ordered across it.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// All threads of all CTAs of the cluster.
__device__ __forceinline__ void cluster_sync() {
#ifdef FLASH_EQLINEAR_WGMMA
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

}  // namespace
}  // namespace flash_eqlinear
