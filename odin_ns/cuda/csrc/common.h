// Per-element arithmetic shared by the CPU (g++) and CUDA (nvcc) kernels.
//
// Every floating-point operation is written out explicitly (no compiler contraction: the
// CPU sources build with -ffp-contract=off, device code uses the *_rn intrinsics), so the
// kernels reproduce the torch reference bit for bit: the same operations, in the same
// order, with the same rounding.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ODIN_HD __host__ __device__ __forceinline__
#else
// Always inlined: the FMA-targeted CPU loops (target("fma")) must inline std::fma as one
// instruction; a call to an out-of-line copy compiled without FMA would use libm's slow
// software fma.
#define ODIN_HD inline __attribute__((always_inline))
#endif

namespace odin {

// ---- IEEE operations with explicit rounding (round to nearest even) --------------------

ODIN_HD float fp_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ODIN_HD double fp_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
ODIN_HD float fp_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ODIN_HD double fp_sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
ODIN_HD float fp_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ODIN_HD double fp_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
ODIN_HD float fp_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ODIN_HD double fp_div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
ODIN_HD float fp_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
ODIN_HD double fp_sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
// Fused multiply-add (one rounding), as torch's AVX2/AVX512 kernels use it.
ODIN_HD float fp_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
ODIN_HD double fp_fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// ---- footprint culling ------------------------------------------------------------------

struct CullParams {
  float width;              // image width in pixels
  float height;             // image height in pixels
  float margin;             // safety margin added to the radius, pixels
  float near_plane;         // keep depth >= near_plane (gsplat)
  float opacity_threshold;  // keep opacity >= opacity_threshold
};

ODIN_HD bool fp_isfinite(float x) {
  // x - x is 0 for finite x and NaN for inf / NaN; NaN compares false.
  return fp_sub(x, x) == 0.0f;
}

ODIN_HD float fp_max(float a, float b) { return a > b ? a : b; }

// Keep primitive (x, y, radius, depth, opacity)? Mirrors reference.footprint_cull:
// gsplat's image test, the square of half-width (radius + margin) around (x, y) overlaps
// the image, evaluated as (x + radius) + margin > 0, (x - radius) - margin < W (and y).
// Branch-free (bitwise &): which primitives survive is data-dependent and unpredictable.
ODIN_HD bool cull_keep(float x, float y, float radius, float depth, float opacity,
                       const CullParams& p) {
  const bool alive = (radius > 0.0f) & (depth >= p.near_plane) &
                     (opacity >= p.opacity_threshold) & fp_isfinite(x) & fp_isfinite(y);
  return alive & (fp_add(fp_add(x, radius), p.margin) > 0.0f) &
         (fp_sub(fp_sub(x, radius), p.margin) < p.width) &
         (fp_add(fp_add(y, radius), p.margin) > 0.0f) &
         (fp_sub(fp_sub(y, radius), p.margin) < p.height);
}

// ---- selective Adam ---------------------------------------------------------------------

// Scalars of one Adam step, already rounded to the tensor dtype the way torch rounds
// Python scalars (computed in double, then cast).
template <typename T>
struct AdamScalars {
  T weight1;    // 1 - beta1                 (exp_avg.lerp_(grad, 1 - beta1))
  T beta2;      // beta2                     (exp_avg_sq.mul_(beta2))
  T weight2;    // 1 - beta2                 (.addcmul_(grad, grad, value=1 - beta2))
  T bias2_sqrt; // sqrt(1 - beta2**step)     (v.sqrt() / bias2_sqrt)
  T eps;        // eps                       (.add_(eps))
  T step_size;  // -lr / (1 - beta1**step)   (param.addcdiv_(m, denom, value=step_size))
};

template <typename T>
inline AdamScalars<T> make_adam_scalars(double lr, double beta1, double beta2, double eps,
                                        int64_t step) {
  // Same double-precision expressions as odin_ns.optim.selective_adam_update_
  // (Python's float ** int and ** 0.5 both call libm pow).
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2_sqrt = std::pow(1.0 - std::pow(beta2, static_cast<double>(step)), 0.5);
  AdamScalars<T> s;
  s.weight1 = static_cast<T>(1.0 - beta1);
  s.beta2 = static_cast<T>(beta2);
  s.weight2 = static_cast<T>(1.0 - beta2);
  s.bias2_sqrt = static_cast<T>(bias2_sqrt);
  s.eps = static_cast<T>(eps);
  s.step_size = static_cast<T>(-lr / bias1);
  return s;
}

// Adam moments of one element, as torch's CPU kernels compute them.
// kFma: torch's AVX2 / AVX512 kernels fuse lerp and addcmul into one FMA each; its DEFAULT
// (non-vector) kernels do not. The caller picks what torch does on this machine.
template <typename T, bool kFma>
ODIN_HD void adam_moments(T grad, T& exp_avg, T& exp_avg_sq, const AdamScalars<T>& s) {
  // exp_avg.lerp_(grad, weight1), at::native::lerp: small weight -> start + w * (end - start),
  // else end - (end - start) * (1 - w) (vectorized: fma(w - 1, end - start, end)).
  const T diff = fp_sub(grad, exp_avg);
  const bool small = (s.weight1 < T(0.5)) && (s.weight1 > T(-0.5));
  if (small) {
    exp_avg = kFma ? fp_fma(s.weight1, diff, exp_avg) : fp_add(exp_avg, fp_mul(s.weight1, diff));
  } else {
    exp_avg = kFma ? fp_fma(fp_sub(s.weight1, T(1)), diff, grad)
                   : fp_sub(grad, fp_mul(diff, fp_sub(T(1), s.weight1)));
  }
  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=weight2): self + (value * t1) * t2
  const T v0 = fp_mul(exp_avg_sq, s.beta2);
  const T wg = fp_mul(s.weight2, grad);
  exp_avg_sq = kFma ? fp_fma(wg, grad, v0) : fp_add(v0, fp_mul(wg, grad));
}

// The parameter update of one element, given sqrt(exp_avg_sq). The square root is the
// caller's: torch's CPU sqrt is MKL VML (not always correctly rounded), so the CPU kernel
// calls at::sqrt to match it; the CUDA kernel uses the IEEE square root.
template <typename T>
ODIN_HD T adam_param(T param, T exp_avg, T sqrt_exp_avg_sq, const AdamScalars<T>& s) {
  // denom = (v.sqrt() / bias2_sqrt).add_(eps)
  const T denom = fp_add(fp_div(sqrt_exp_avg_sq, s.bias2_sqrt), s.eps);
  // param.addcdiv_(m, denom, value=step_size): self + (value * t1) / t2
  return fp_add(param, fp_div(fp_mul(s.step_size, exp_avg), denom));
}

// The L2 norm of a row's first n float32 values (record_row_norms), as
// reference.record_row_norms computes it: float64 squares (exact) summed in column order, the
// float64 square root, rounded to float32.
ODIN_HD float row_norm(const float* row, int64_t n) {
  double total = 0.0;
  for (int64_t c = 0; c < n; ++c) {
    const double x = row[c];
    total = fp_add(total, fp_mul(x, x));
  }
#if defined(__CUDA_ARCH__)
  return __double2float_rn(fp_sqrt(total));
#else
  return static_cast<float>(fp_sqrt(total));
#endif
}

}  // namespace odin
