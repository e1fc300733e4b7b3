// Per-kernel launch properties, cached per kernel and device. The largest dynamic shared memory a kernel may
// launch with (cudaFuncAttributeMaxDynamicSharedMemorySize), set once per kernel and device: each
// cudaFuncSetAttribute call costs host time, and setting it before every launch made many such calls per eager
// training step (measurements: docs/kernels.md, Launch attributes). The attribute is a maximum and stays set in
// the device's context, so a kernel's largest size so far is kept and only a larger one is set again.
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include <cuda_runtime.h>

namespace flash_eqlinear {

inline cudaError_t set_max_dynamic_smem(const void* kernel, int bytes) {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> largest;  // (kernel, device) -> bytes set
  const std::lock_guard<std::mutex> lock(mu);
  int& set = largest[{kernel, dev}];
  if (set >= bytes) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) set = bytes;
  return e;
}

template <class K> cudaError_t set_max_dynamic_smem(K* kernel, int bytes) {
  return set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// Resident blocks per SM of a kernel launched with `threads` threads and `smem` bytes of dynamic shared memory
// on the current device (its shared-memory attribute set first where smem needs it), queried once per kernel
// and device; 1 where the query fails, its error cleared so that the launch check does not report it.
inline int resident_blocks_per_sm(const void* kernel, int threads, int smem) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    dev = -1;
  }
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> known;  // (kernel, device) -> blocks
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (const auto it = known.find({kernel, dev}); it != known.end()) return it->second;
  }
  if (smem > 48 * 1024) set_max_dynamic_smem(kernel, smem);
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess || n < 1) {
    cudaGetLastError();
    n = 1;
  }
  const std::lock_guard<std::mutex> lock(mu);
  known[{kernel, dev}] = n;  // racing callers store the same value
  return n;
}

template <class K> int resident_blocks_per_sm(K* kernel, int threads, int smem) {
  return resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);
}

}  // namespace flash_eqlinear
