// Programmatic dependent launch (sm_90+): the forward kernels are launched with it, so that each one's
// launch overlaps the end of the kernel before it in the stream instead of following its completion.
//
// Device side: pdl_wait() at the top of the kernel (every thread) returns once the kernels this one
// depends on have completed and their memory is visible; nothing before it reads or writes global
// memory (the inputs may still be in the making, the output buffer may still be read). It is a no-op
// when the kernel was launched without the attribute and compiles to nothing below sm_90.
// None of our kernels triggers its dependents early (griddepcontrol.launch_dependents): their
// successors launch as they finish. An early trigger let the next launch of the narrow kernel's
// persistent grid pile onto the SMs that freed up first, more blocks than the grid is sized for, which
// split its fixed work unevenly, and slowed the Hopper kernel too; launching with the attribute and
// waiting only was never slower beyond noise and helps short layers (measurements: docs/kernels.md,
// Programmatic dependent launch). A driver that rejects the attribute gets a plain launch.
//
// Host side: launch_maybe_pdl sets the attribute on devices of compute capability 9.0 and later unless
// FLASH_EQLINEAR_DEBUG has pdl=0 (the switch to time or debug without it; read at each launch; the capability is
// queried once per device).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "eq_switches.h"

namespace flash_eqlinear {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether launches on device `dev` take the attribute.
inline bool pdl_enabled(int dev) {
  if (debug_is("pdl", "0")) return false;
  static std::atomic<int8_t> known[64] = {};  // 0 unknown, 1 yes, -1 no (every writer writes the same)
  if (dev >= 0 && dev < 64) {
    const int8_t k = known[dev].load(std::memory_order_relaxed);
    if (k != 0) return k == 1;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (dev >= 0 && dev < 64) known[dev].store(major >= 9 ? 1 : -1, std::memory_order_relaxed);
  return major >= 9;
}

// cfg (grid, block, shared memory, stream, and cfg.numAttrs attributes of its own in attrs, which has
// room for one more) launched with the programmatic-serialization attribute added where pdl_enabled.
template <class... KArgs, class... Args>
cudaError_t launch_maybe_pdl(cudaLaunchConfig_t cfg, cudaLaunchAttribute* attrs, void (*kernel)(KArgs...),
                             Args&&... args) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  cfg.attrs = attrs;
  if (pdl_enabled(dev)) {
    cudaLaunchConfig_t with = cfg;
    attrs[with.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[with.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++with.numAttrs;
    e = cudaLaunchKernelEx(&with, kernel, args...);
    // A driver or context that rejects the attribute gets the plain launch (the launch error is not sticky).
    if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue) return e;
    cudaGetLastError();
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The common case: no attributes of its own.
template <class... KArgs, class... Args>
cudaError_t launch_maybe_pdl(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*kernel)(KArgs...),
                             Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[1];
  return launch_maybe_pdl(cfg, attrs, kernel, std::forward<Args>(args)...);
}

}  // namespace flash_eqlinear
