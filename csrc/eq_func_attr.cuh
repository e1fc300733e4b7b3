// The largest dynamic shared memory a kernel may launch with (cudaFuncAttributeMaxDynamicSharedMemorySize), set
// once per kernel and device: cudaFuncSetAttribute costs ~3 us of host time, and the launchers, which set it
// before each launch, made ~150 such calls per eager EQ-ViT-B training step. The attribute is a maximum and stays
// set in the device's context, so a kernel's largest size so far is kept and only a larger one is set again.
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

}  // namespace flash_eqlinear
