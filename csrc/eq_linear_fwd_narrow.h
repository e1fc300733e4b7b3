// Forward for narrow layers (c, d <= 32): one streaming pass, FP32 arithmetic for every element type
// (eq_linear_fwd_narrow.cu). Layouts and math: eq_linear_fwd.h.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "eq_linear_fwd.h"

namespace flash_eqlinear {

// Largest c and d the narrow kernel takes; where the alternative runs on tensor cores (fp16, bf16,
// FP32 with TF32 allowed), the largest c * d where the narrow kernel runs instead (its FFMA cost
// grows as c * d, theirs has a fixed floor). H100, M = 32768 (benchmarks/bench_narrow.py): exact
// FP32 c = d = 16 / 32: 8.4 / 19.0 us against the tiled kernel's 19.4 / 27.1 us; fp16 c = d = 16:
// 8.2 against 8.5 us, c = d = 32: 17.9 against 8.6 us.
constexpr int64_t kNarrowMaxC = 32;
constexpr int64_t kNarrowMaxCDTensorCore = 16 * 16;

// Whether the forward of a layer of this size runs the narrow kernel (exact_fp32: float tensors with
// TF32 not allowed). FLASH_EQLINEAR_NARROW=0: never (to test the other kernels on small layers);
// =1: whenever c, d <= 32 (to test and time it beyond the tensor-core size limit).
bool eq_linear_fwd_narrow_applies(int64_t c, int64_t d, bool exact_fp32);

// One launch on `stream` (any alignment; any M >= 0). cudaErrorInvalidValue outside c, d <= 32.
cudaError_t eq_linear_fwd_narrow(const FwdParams& p, int elem_bytes, bool bf16, cudaStream_t stream);

}  // namespace flash_eqlinear
