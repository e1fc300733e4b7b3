// The group-axis transform of a group-domain weight into its frequency planes and its adjoint, one pass
// each (the eager layer on a naive layer's own parameters: flash_eqlinear::group_planes).
//
// Torch-free on purpose: this header and the kernel compile with plain nvcc.
//
//   forward  (adjoint = false): src (n, T) rows contiguous (the weight (d, c, T), n = d * c)
//                               -> dst (T, n): dst[k][i] = sum_t basis[k][t] * src[i][t]
//   adjoint  (adjoint = true):  src (T, n) (the planes' gradient) -> dst (n, T):
//                               dst[i][t] = sum_k basis[k][t] * src[k][i]
// basis (T, T) FP32, row-major; FP32 arithmetic, one rounding per stored value. src and dst each float,
// __half or __nv_bfloat16 (Elem), independently.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "eq_elem.h"

namespace flash_eqlinear {

// The largest group size the kernel takes (its per-thread arrays); larger T: the stock-op form.
constexpr int kGroupPlanesMaxT = 16;

struct GroupPlanesParams {
  const void* src;
  void* dst;
  const float* basis;  // (T, T), device memory
  int64_t n;           // group-weight rows d * c (>= 0)
  int T;               // 1 .. kGroupPlanesMaxT
  bool adjoint;
  Elem src_elem, dst_elem;
};

// One launch on `stream`; cudaErrorInvalidValue for bad sizes.
cudaError_t eq_group_planes(const GroupPlanesParams& p, cudaStream_t stream);

}  // namespace flash_eqlinear
