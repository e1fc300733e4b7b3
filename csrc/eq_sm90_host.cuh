// Host helpers of the Hopper (sm_90a) kernels: TMA descriptor encoding through the runtime's driver
// entry point, and whether a kernel's loaded code is sm_90a machine code. In an anonymous namespace:
// each kernel file has its own copy.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cuda_runtime.h>

namespace flash_eqlinear {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled, or nullptr with a driver that lacks it.
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// Row-major tensor of 16- or 32-bit elements: dims / byte strides innermost first (strides of dims
// 1..rank-1). The element type only sets the element size: TMA copies bits.
bool encode(CUtensorMap* map, const void* ptr, int elem_bytes, int rank, const cuuint64_t* dims,
            const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  const EncodeTiled fn = encoder();
  const cuuint32_t unit[3] = {1, 1, 1};
  const auto type = elem_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
  return fn != nullptr && fn(map, type, rank, const_cast<void*>(ptr), dims, strides,
                             box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether `kernel` runs as sm_90a machine code on device dev: a device that picked other code (an
// sm_90 binary, or PTX of an older target compiled at load time) must not launch a Hopper kernel,
// whose body exists only in sm_90a code. Cached per device in `known` (0 unknown, 1 yes, -1 no; a
// benign race: every writer writes the same).
template <class K>
bool kernel_runs_sm90a(K* kernel, int dev, int8_t (&known)[64]) {
  if (dev < 0 || dev >= 64) return false;
  if (known[dev] == 0) {
    cudaFuncAttributes attr;
    const bool ok = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90 &&
                    attr.ptxVersion == 90;
    cudaGetLastError();  // a failed query leaves no sticky state behind for the caller
    known[dev] = ok ? 1 : -1;
  }
  return known[dev] == 1;
}

}  // namespace
}  // namespace flash_eqlinear
