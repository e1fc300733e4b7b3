// The group transforms of the GEMM form for group sizes other than 4 (T = 2 and 8): the orthonormal real DFT
// of x along its group axis into column blocks, and the synthesis of FP32 plane products back to the group
// axis with the bias (flash_eqlinear::eq_linear_fwd_t).
//
// Torch-free on purpose: this header and the kernels compile with plain nvcc.
//
//   analysis:  x (M, c, T) contiguous -> f (M, T c), column block j = sum_s q[j][s] x[:, :, s]
//   synthesis: a (M, T d) FP32 (row stride lda >= T d), bias (d,) or nullptr
//              -> y (M, d, T) contiguous, y[:, o, t] = sum_j q[j][t] a[:, j d + o] (+ bias[o])
// q: a (T, T) matrix given by the caller (the analysis: the DFT basis in plane order times a power-of-two
// scale that keeps 16-bit values in range; the synthesis: the basis itself). FP32 arithmetic, one rounding
// per stored value. x, f, y and bias of one element type: float, __half or __nv_bfloat16.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "eq_elem.h"

namespace flash_eqlinear {

// The group sizes the kernels are built for.
inline bool group_dft_t_supported(int T) { return T == 2 || T == 8; }

struct GroupDftTParams {
  const void* src;   // analysis: x; synthesis: a (float)
  void* dst;         // analysis: f; synthesis: y
  const void* bias;  // synthesis only; nullptr: none
  int64_t M, n;      // rows; channels per group copy (analysis: c, synthesis: d)
  int64_t lda;       // synthesis: a's row stride
  int T;
  float q[64];       // (T, T) row-major
};

cudaError_t eq_group_dft_t_analysis(const GroupDftTParams& p, Elem elem, cudaStream_t stream);
cudaError_t eq_group_dft_t_synthesis(const GroupDftTParams& p, Elem elem, cudaStream_t stream);

}  // namespace flash_eqlinear
