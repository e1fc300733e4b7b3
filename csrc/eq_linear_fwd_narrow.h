// Forward for narrow layers (c, d <= 32): one streaming pass, FP32 arithmetic for every element type
// (eq_linear_fwd_narrow.cu). Layouts and math: eq_linear_fwd.h.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "eq_linear_fwd.h"

namespace flash_eqlinear {

// Largest c and d the narrow kernel takes, and for 16-bit types the largest c * d where it runs
// instead of the tensor-core kernels (its FFMA cost grows as c * d, theirs has a fixed floor).
constexpr int64_t kNarrowMaxC = 32;
constexpr int64_t kNarrowMaxCD16 = 16 * 16;

// Whether the forward of a layer of this size and element size (4: float, 2: half / bfloat16) runs
// the narrow kernel. FLASH_EQLINEAR_NARROW=0: never (to test the other kernels on small layers);
// =1: whenever c, d <= 32 (to test and time it beyond the 16-bit size limit).
bool eq_linear_fwd_narrow_applies(int64_t c, int64_t d, int elem_bytes);

// One launch on `stream` (any alignment; any M >= 0). cudaErrorInvalidValue outside c, d <= 32.
cudaError_t eq_linear_fwd_narrow(const FwdParams& p, int elem_bytes, bool bf16, cudaStream_t stream);

}  // namespace flash_eqlinear
