// Forward for narrow layers (c, d <= 32; exact FP32 up to 64): one streaming pass; exact FP32 FFMA, or mma.sync for fp16 /
// bf16 (eq_linear_fwd_narrow.cu). Layouts and math: eq_linear_fwd.h.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "eq_linear_fwd.h"

namespace flash_eqlinear {

// Largest c and d the narrow kernel takes (exact FP32 runs it for all of them). fp16 / bf16 run it for
// all of them on its mma.sync variant (c, d even, x / y 16-byte aligned), else on its FFMA variant for
// d <= 16; FP32 with TF32 allowed for c * d <= 256: where each measured faster than the tiled kernels
// (docs/kernels.md, Narrow forward).
constexpr int64_t kNarrowMaxC = 32;
// Exact FP32 also has tiles for c, d up to 64 (KC = 64: one block of 8 warps per SM); taken by default
// where they beat the tiled FP32 kernel on an H100 (one of c, d <= 32, the other <= 64), else only when
// forced (FLASH_EQLINEAR_DEBUG narrow=1).
constexpr int64_t kNarrowMaxCFp32 = 64;
constexpr int64_t kNarrowMaxDFfma16 = 16;
constexpr int64_t kNarrowMaxCDTf32 = 16 * 16;

// Whether the forward of a layer with these params runs the narrow kernel (elem_bytes 4: float, 2:
// half / bfloat16; tf32: float with TF32 allowed). FLASH_EQLINEAR_DEBUG narrow=0: never (to test the other
// kernels on small layers); =1: whenever c, d <= 32, or <= 64 for float (to test and time it beyond
// those limits).
bool eq_linear_fwd_narrow_applies(const FwdParams& p, int elem_bytes, bool tf32);

// One launch on `stream` (any alignment; any M >= 0). cudaErrorInvalidValue outside c, d <= 32 (64 for
// float).
cudaError_t eq_linear_fwd_narrow(const FwdParams& p, int elem_bytes, bool bf16, cudaStream_t stream);

}  // namespace flash_eqlinear
