// Host-side helpers shared by the CPU and CUDA libraries: input validation, and which
// float arithmetic torch's CPU kernels use here.
//
// Every check runs before any output is allocated or any in-place argument is written, and
// raises ValueError (TORCH_CHECK_VALUE) with a one-line message, like
// odin_ns.cuda.reference.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Version.h>

#include <string>
#include <tuple>

namespace odin {

// "torch.int32" etc., as Python prints dtypes.
inline std::string dtype_name(at::ScalarType t) {
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

inline void check_device(const at::Tensor& t, const at::Device& device, const char* op,
                         const char* name) {
  TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, " is on ", t.device(),
                    " but the other inputs are on ", device);
}

inline void check_dtype(const at::Tensor& t, at::ScalarType dtype, const char* op,
                        const char* name) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype_name(dtype),
                    ", got ", dtype_name(t.scalar_type()));
}

inline void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name,
                    " must be contiguous (it is updated in place)");
}

inline void check_shape_1d(const at::Tensor& t, int64_t n, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 1 && (n < 0 || t.size(0) == n), op, ": ", name,
                    " must have shape [", (n < 0 ? std::string("M") : std::to_string(n)),
                    "], got ", t.sizes());
}

// ids: [M] int64, every value in [0, n). One device->host copy of (min, max) on CUDA.
inline void check_ids(const at::Tensor& ids, int64_t n, const char* op, const char* name) {
  TORCH_CHECK_VALUE(ids.dim() == 1, op, ": ", name, " must be 1-D, got shape ", ids.sizes());
  check_dtype(ids, at::kLong, op, name);
  if (ids.numel() == 0) {
    return;
  }
  auto [lo_t, hi_t] = at::aminmax(ids);
  const auto bounds = at::stack({lo_t, hi_t}).cpu();
  const int64_t lo = bounds[0].item<int64_t>();
  const int64_t hi = bounds[1].item<int64_t>();
  TORCH_CHECK_VALUE(lo >= 0 && hi < n, op, ": ", name, " out of range: values span [", lo,
                    ", ", hi, "] but must lie in [0, ", n, ")");
}

// Validated, contiguous float32 views of footprint_cull's inputs.
struct CullInputs {
  at::Tensor means2d;    // [V, N, 2] float32
  at::Tensor radii;      // [V, N] float32
  at::Tensor depths;     // [V, N] float32
  at::Tensor opacities;  // [N] float32
  int64_t num_views;
  int64_t num_prims;
};

inline CullInputs check_cull_inputs(const at::Tensor& means2d, const at::Tensor& radii,
                                    const at::Tensor& depths, const at::Tensor& opacities,
                                    int64_t width, int64_t height, double margin_px) {
  const char* op = "footprint_cull";
  TORCH_CHECK_VALUE(means2d.dim() == 3 && means2d.size(2) == 2, op,
                    ": means2d must have shape [V, N, 2], got ", means2d.sizes());
  const int64_t V = means2d.size(0);
  const int64_t N = means2d.size(1);
  TORCH_CHECK_VALUE(radii.dim() == 2 && radii.size(0) == V && radii.size(1) == N, op,
                    ": radii must have shape [", V, ", ", N, "], got ", radii.sizes());
  TORCH_CHECK_VALUE(depths.dim() == 2 && depths.size(0) == V && depths.size(1) == N, op,
                    ": depths must have shape [", V, ", ", N, "], got ", depths.sizes());
  TORCH_CHECK_VALUE(opacities.dim() == 1 && opacities.size(0) == N, op,
                    ": opacities must have shape [", N, "], got ", opacities.sizes());
  const auto device = means2d.device();
  check_device(radii, device, op, "radii");
  check_device(depths, device, op, "depths");
  check_device(opacities, device, op, "opacities");
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{means2d, "means2d"},
                                {radii, "radii"},
                                {depths, "depths"},
                                {opacities, "opacities"}}) {
    TORCH_CHECK_VALUE(t.scalar_type() != at::kBool && !at::isComplexType(t.scalar_type()), op,
                      ": ", name, " must be real-valued, got ", dtype_name(t.scalar_type()));
  }
  TORCH_CHECK_VALUE(width > 0 && height > 0, op, ": width and height must be positive, got ",
                    width, " x ", height);
  TORCH_CHECK_VALUE(margin_px >= 0.0, op, ": margin_px must be >= 0, got ", margin_px);
  return {means2d.to(at::kFloat).contiguous(),
          radii.to(at::kFloat).contiguous(),
          depths.to(at::kFloat).contiguous(),
          opacities.to(at::kFloat).contiguous(),
          V,
          N};
}

// Validated [N, cols] float32 views of pack_rows's tensors (same device as ids).
inline std::vector<at::Tensor> check_pack_inputs(const at::Tensor& ids,
                                                 at::TensorList tensors) {
  const char* op = "pack_rows";
  TORCH_CHECK_VALUE(!tensors.empty(), op, ": tensors must not be empty");
  TORCH_CHECK_VALUE(tensors[0].dim() >= 1, op, ": tensors[0] must have shape [N, ...], got ",
                    tensors[0].sizes());
  const int64_t N = tensors[0].size(0);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = tensors[k];
    TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(0) == N, op, ": tensors[", k,
                      "] must have shape [N, ...] with N = ", N, ", got ", t.sizes());
    TORCH_CHECK_VALUE(at::isFloatingType(t.scalar_type()), op, ": tensors[", k,
                      "] must be a floating-point tensor, got ", dtype_name(t.scalar_type()));
    TORCH_CHECK_VALUE(t.device() == ids.device(), op, ": tensors[", k, "] is on ", t.device(),
                      " but ids is on ", ids.device());
  }
  check_ids(ids, N, op, "ids");
  std::vector<at::Tensor> rows;
  rows.reserve(tensors.size());
  for (const auto& t : tensors) {
    const int64_t cols = c10::multiply_integers(t.sizes().slice(1));
    rows.push_back(t.reshape({N, cols}).to(at::kFloat).contiguous());
  }
  return rows;
}

inline void check_unpack_inputs(const at::Tensor& buffer, const at::Tensor& ids,
                                const at::Tensor& accum, const at::Tensor& arrivals) {
  const char* op = "unpack_accumulate";
  TORCH_CHECK_VALUE(accum.dim() == 2, op, ": accum must have shape [N, D], got ",
                    accum.sizes());
  const int64_t N = accum.size(0);
  const int64_t D = accum.size(1);
  TORCH_CHECK_VALUE(ids.dim() == 1, op, ": ids must be 1-D, got shape ", ids.sizes());
  TORCH_CHECK_VALUE(buffer.dim() == 2 && buffer.size(0) == ids.size(0) && buffer.size(1) == D,
                    op, ": buffer must have shape [", ids.size(0), ", ", D, "], got ",
                    buffer.sizes());
  check_shape_1d(arrivals, N, op, "arrivals");
  check_dtype(buffer, at::kFloat, op, "buffer");
  check_dtype(accum, at::kFloat, op, "accum");
  check_dtype(arrivals, at::kInt, op, "arrivals");
  const auto device = accum.device();
  check_device(buffer, device, op, "buffer");
  check_device(ids, device, op, "ids");
  check_device(arrivals, device, op, "arrivals");
  check_contiguous(accum, op, "accum");
  check_contiguous(arrivals, op, "arrivals");
  check_ids(ids, N, op, "ids");
}

inline void check_ready_inputs(const at::Tensor& arrivals, const at::Tensor& expected,
                               const at::Tensor& blocked) {
  const char* op = "ready_mask";
  TORCH_CHECK_VALUE(arrivals.dim() == 1, op, ": arrivals must have shape [N], got ",
                    arrivals.sizes());
  const int64_t N = arrivals.size(0);
  check_shape_1d(expected, N, op, "expected");
  check_shape_1d(blocked, N, op, "blocked");
  check_dtype(arrivals, at::kInt, op, "arrivals");
  check_dtype(expected, at::kInt, op, "expected");
  check_dtype(blocked, at::kBool, op, "blocked");
  check_device(expected, arrivals.device(), op, "expected");
  check_device(blocked, arrivals.device(), op, "blocked");
}

inline void check_adam_inputs(const at::Tensor& param, const at::Tensor& grad,
                              const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                              const at::Tensor& mask, const at::Tensor& versions,
                              double beta1, double beta2, int64_t step) {
  const char* op = "selective_adam_apply";
  TORCH_CHECK_VALUE(param.dim() >= 1, op, ": param must have shape [N, ...], got ",
                    param.sizes());
  TORCH_CHECK_VALUE(param.scalar_type() == at::kFloat || param.scalar_type() == at::kDouble,
                    op, ": param must be float32 or float64, got ", dtype_name(param.scalar_type()));
  const int64_t N = param.size(0);
  const auto device = param.device();
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{grad, "grad"},
                                {exp_avg, "exp_avg"},
                                {exp_avg_sq, "exp_avg_sq"}}) {
    TORCH_CHECK_VALUE(t.sizes() == param.sizes(), op, ": ", name, " must have shape ",
                      param.sizes(), " like param, got ", t.sizes());
    check_dtype(t, param.scalar_type(), op, name);
    check_device(t, device, op, name);
  }
  check_shape_1d(mask, N, op, "mask");
  check_shape_1d(versions, N, op, "versions");
  check_dtype(mask, at::kBool, op, "mask");
  check_dtype(versions, at::kLong, op, "versions");
  check_device(mask, device, op, "mask");
  check_device(versions, device, op, "versions");
  check_contiguous(param, op, "param");
  check_contiguous(exp_avg, op, "exp_avg");
  check_contiguous(exp_avg_sq, op, "exp_avg_sq");
  check_contiguous(versions, op, "versions");
  TORCH_CHECK_VALUE(step >= 1, op, ": step is the 1-based bias-correction count, got ", step);
  TORCH_CHECK_VALUE(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0, op,
                    ": betas must lie in [0, 1), got (", beta1, ", ", beta2, ")");
}

inline void check_validate_inputs(const at::Tensor& read_ids, const at::Tensor& versions,
                                  const at::Tensor& required) {
  const char* op = "validate_reads";
  TORCH_CHECK_VALUE(versions.dim() == 1, op, ": versions must have shape [N], got ",
                    versions.sizes());
  TORCH_CHECK_VALUE(read_ids.dim() == 1, op, ": read_ids must be 1-D, got shape ",
                    read_ids.sizes());
  check_shape_1d(required, read_ids.size(0), op, "required");
  check_dtype(versions, at::kLong, op, "versions");
  check_dtype(required, at::kLong, op, "required");
  check_device(read_ids, versions.device(), op, "read_ids");
  check_device(required, versions.device(), op, "required");
  check_ids(read_ids, versions.size(0), op, "read_ids");
}

// Whether torch's CPU kernels (lerp, addcmul) fuse multiply-adds on this machine: its
// AVX2 / AVX512 kernels do (vec::fmadd), the DEFAULT ones do not; NEON always fuses.
inline bool torch_cpu_uses_fma() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool fused = [] {
    const std::string cap = at::get_cpu_capability();
    return cap == "AVX2" || cap == "AVX512";
  }();
  return fused;
#elif defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

}  // namespace odin
