// Forward for narrow layers (c <= 32 for float, c <= 16 for fp16 / bf16; d <= 64), tried by the
// bindings before the tile kernels. Layouts and math: eq_linear_fwd.h.
#pragma once

#include <cuda_runtime.h>

#include "eq_linear_fwd.h"

namespace flash_eqlinear {

// False when FLASH_EQLINEAR_SMALL=0: the tile kernels take narrow layers too (tests run both).
bool small_path_enabled();

// Launch when the sizes and alignments (x, y aligned to 4 elements) qualify (*launched = true, the
// launch error returned); otherwise launch nothing, *launched = false, cudaSuccess. elem_bytes 4
// (float: exact FP32) or 2 (bf16 ? __nv_bfloat16 : __half).
cudaError_t eq_linear_fwd_small(const FwdParams& p, int elem_bytes, bool bf16, cudaStream_t stream, bool* launched);

}  // namespace flash_eqlinear
