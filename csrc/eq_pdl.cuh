// Programmatic dependent launch (sm_90+): a forward kernel launched with it may start while the kernel
// before it in the stream is still finishing, so its launch and set-up overlap that kernel's tail.
//
// Device side, at the top of the kernel (every thread):
//   pdl_trigger(): this CTA lets the next kernel in the stream (if launched the same way) be scheduled;
//     it is scheduled once every CTA of this grid has triggered or exited, so all of this grid's CTAs
//     are resident by then and a waiting dependent can never hold an SM one of them needs.
//   pdl_wait(): returns once the kernels this one depends on have completed and their memory is visible.
//     Nothing before it may read or write global memory (kernel parameters, tensor maps included, are
//     not global memory: prefetching a __grid_constant__ tensor map is fine).
// Both are no-ops when the kernel was launched without the attribute, and compile to nothing below
// sm_90.
//
// Host side: launch_maybe_pdl sets the attribute on devices of compute capability 9.0 and later unless
// FLASH_EQLINEAR_PDL=0 (the switch to time or debug without it; read at each launch).
#pragma once

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

namespace flash_eqlinear {

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether launches on device `dev` take the attribute.
inline bool pdl_enabled(int dev) {
  const char* v = std::getenv("FLASH_EQLINEAR_PDL");
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// cfg (grid, block, shared memory, stream and any attributes of its own, room for one more in attrs)
// launched with the programmatic-serialization attribute added where pdl_enabled.
template <class... KArgs, class... Args>
cudaError_t launch_maybe_pdl(cudaLaunchConfig_t cfg, cudaLaunchAttribute* attrs, void (*kernel)(KArgs...),
                             Args&&... args) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (pdl_enabled(dev)) {
    attrs[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++cfg.numAttrs;
  }
  cfg.attrs = attrs;
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
