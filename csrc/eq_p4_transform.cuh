// The p4 group transform of one (row, channel) quadruple in FP32, shared by every kernel (math and
// scalings: eq_linear_fwd.h). Device functions only, in an anonymous namespace: each kernel file
// has its own copy.
#pragma once

#include <cuda_runtime.h>

namespace flash_eqlinear {
namespace {

// (f0, fR, fI, f2) of (x0, x1, x2, x3): f0 = x0+x1+x2+x3, fR = x0-x2, fI = x3-x1, f2 = x0-x1+x2-x3.
// kHalve: half of each (the fp16 kernels' prologue: x0+x1+x2+x3 overflows fp16 for |x| > 16384,
// its half does not for |x| <= 32752; the halvings are exact).
template <bool kHalve>
__device__ __forceinline__ void dft4(float x0, float x1, float x2, float x3, float& f0, float& fr,
                                     float& fi, float& f2) {
  if constexpr (kHalve) {
    const float u = 0.5f * x0, v = 0.5f * x3;  // exact
    fr = fmaf(-0.5f, x2, u);
    fi = fmaf(-0.5f, x1, v);
    const float s02 = fmaf(0.5f, x2, u), s13 = fmaf(0.5f, x1, v);
    f0 = s02 + s13;
    f2 = s02 - s13;
  } else {
    fr = x0 - x2;
    fi = x3 - x1;
    const float s02 = x0 + x2, s13 = x1 + x3;
    f0 = s02 + s13;
    f2 = s02 - s13;
  }
}

// (y0, y1, y2, y3) of one output channel from the accumulated plane products (a0, a2, aR, aI) and
// the bias b: y0 = (a0 + a2) / 2 + aR / sqrt2 + b, y1 = (a0 - a2) / 2 - aI / sqrt2 + b,
// y2 = (a0 + a2) / 2 - aR / sqrt2 + b, y3 = (a0 - a2) / 2 + aI / sqrt2 + b.
// kHalved: the accumulators hold half of those products (a kHalve prologue): y0 = a0 + a2 + sqrt2 aR + b etc.
template <bool kHalved = false>
__device__ __forceinline__ float4 inverse_dft4_f32(float a0, float a2, float ar, float ai, float b) {
  constexpr float kA = kHalved ? 1.f : 0.5f;
  constexpr float kR = kHalved ? 1.41421356237309515f : 0.70710678118654752f;
  const float s = fmaf(kA, a0 + a2, b), t = fmaf(kA, a0 - a2, b);
  return make_float4(fmaf(kR, ar, s), fmaf(-kR, ai, t), fmaf(-kR, ar, s), fmaf(kR, ai, t));
}

}  // namespace
}  // namespace flash_eqlinear
