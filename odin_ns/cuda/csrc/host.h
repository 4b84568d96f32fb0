// Host-side helpers shared by the CPU and CUDA libraries: input validation, and which
// float arithmetic torch's CPU kernels use here.
//
// Every check runs before any output is allocated or any in-place argument is written, and
// raises ValueError (TORCH_CHECK_VALUE) with a one-line message, like
// odin_ns.cuda.reference.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Version.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>
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

// Whether an op's checks read the values of t (ids' range and order): always on the host;
// on a device only with ODIN_NS_DEBUG_CHECKS=1, since the read waits for the stream (the
// twin of reference.py's reads_values).
inline bool reads_values(const at::Tensor& t) {
  if (t.device().is_cpu()) {
    return true;
  }
  const char* debug = std::getenv("ODIN_NS_DEBUG_CHECKS");
  return debug != nullptr && std::string(debug) == "1";
}

// ids: [M] int64, every value in [0, n) (the values checked where reads_values allows).
inline void check_ids(const at::Tensor& ids, int64_t n, const char* op, const char* name) {
  TORCH_CHECK_VALUE(ids.dim() == 1, op, ": ", name, " must be 1-D, got shape ", ids.sizes());
  check_dtype(ids, at::kLong, op, name);
  if (ids.numel() == 0 || !reads_values(ids)) {
    return;
  }
  const auto c = ids.cpu().contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const auto [lo, hi] = std::minmax_element(p, p + c.numel());
  TORCH_CHECK_VALUE(*lo >= 0 && *hi < n, op, ": ", name, " out of range: values span [", *lo,
                    ", ", *hi, "] but must lie in [0, ", n, ")");
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

// pack_rows / scatter_rows' column groups: at least one, each [N, ...] with one N, on ids'
// device; returns N.
inline int64_t check_columns(at::TensorList columns, const at::Tensor& ids, const char* op) {
  TORCH_CHECK_VALUE(!columns.empty(), op, ": columns must not be empty");
  TORCH_CHECK_VALUE(columns[0].dim() >= 1, op, ": columns[0] must have shape [N, ...], got ",
                    columns[0].sizes());
  const int64_t N = columns[0].size(0);
  for (size_t k = 0; k < columns.size(); ++k) {
    const auto& t = columns[k];
    TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(0) == N, op, ": columns[", k,
                      "] must have shape [N, ...] with N = ", N, ", got ", t.sizes());
    TORCH_CHECK_VALUE(t.device() == ids.device(), op, ": columns[", k, "] is on ", t.device(),
                      " but ids is on ", ids.device());
  }
  return N;
}

// Range and strict increase of a non-empty [M] int64 host id list, in one pass.
struct HostIdStats {
  int64_t lo;
  int64_t hi;
  bool increasing;
};

inline HostIdStats host_id_stats(const at::Tensor& ids_cpu) {
  const auto c = ids_cpu.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  HostIdStats s{p[0], p[0], true};
  for (int64_t i = 1; i < c.numel(); ++i) {
    s.increasing &= p[i] > p[i - 1];
    s.lo = std::min(s.lo, p[i]);
    s.hi = std::max(s.hi, p[i]);
  }
  return s;
}

// A step's union of footprints: [U] int64 ids in [0, N), strictly increasing (the values
// checked where reads_values allows; mirrors reference._check_union_ids).
inline void check_union_ids(const at::Tensor& ids, int64_t U, int64_t N, const char* op) {
  TORCH_CHECK_VALUE(ids.dim() == 1 && ids.size(0) == U, op, ": ids must have shape [", U,
                    "], got ", ids.sizes());
  check_dtype(ids, at::kLong, op, "ids");
  if (U == 0 || !reads_values(ids)) {
    return;
  }
  const auto [lo, hi, increasing] = host_id_stats(ids.cpu());  // range and order, one pass
  TORCH_CHECK_VALUE(lo >= 0 && hi < N, op, ": ids out of range: values span [", lo, ", ", hi,
                    "] but must lie in [0, ", N, ")");
  TORCH_CHECK_VALUE(increasing, op,
                    ": ids must be strictly increasing (the step's sorted union of footprints)");
}

// Validated [N, cols] float32 views of pack_rows's tensors (same device as ids).
inline std::vector<at::Tensor> check_pack_inputs(const at::Tensor& ids,
                                                 at::TensorList columns) {
  const char* op = "pack_rows";
  const int64_t N = check_columns(columns, ids, op);
  for (size_t k = 0; k < columns.size(); ++k) {
    TORCH_CHECK_VALUE(at::isFloatingType(columns[k].scalar_type()), op, ": columns[", k,
                      "] must be a floating-point tensor, got ",
                      dtype_name(columns[k].scalar_type()));
  }
  check_ids(ids, N, op, "ids");
  std::vector<at::Tensor> rows;
  rows.reserve(columns.size());
  for (const auto& t : columns) {
    const int64_t cols = c10::multiply_integers(t.sizes().slice(1));
    rows.push_back(t.reshape({N, cols}).to(at::kFloat).contiguous());
  }
  return rows;
}

// Validated [N, cols] float32 views of scatter_rows's columns (written in place), every
// part checked before any is written (mirrors reference.scatter_rows, same messages): part
// j's ids in range and strictly increasing, read on the host always, on a device only with
// ODIN_NS_DEBUG_CHECKS=1 (the read waits for the stream); its buffer [M_j, W_j >= sum(d_g)].
inline std::vector<at::Tensor> check_scatter_inputs(at::TensorList columns, at::TensorList ids,
                                                    at::TensorList buffers) {
  const char* op = "scatter_rows";
  TORCH_CHECK_VALUE(ids.size() == buffers.size(), op, ": ", ids.size(), " id lists but ",
                    buffers.size(), " buffers");
  std::vector<at::Tensor> rows;
  for (size_t j = 0; j < ids.size(); ++j) {
    const std::string ids_name = "ids[" + std::to_string(j) + "]";
    const std::string buffer_name = "buffers[" + std::to_string(j) + "]";
    const at::Tensor& part = ids[j];
    const at::Tensor& buffer = buffers[j];
    const int64_t N = check_columns(columns, part, op);
    rows.clear();
    int64_t D = 0;
    for (size_t k = 0; k < columns.size(); ++k) {
      const auto& t = columns[k];
      TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat, op, ": columns[", k,
                        "] must be float32, got ", dtype_name(t.scalar_type()));
      TORCH_CHECK_VALUE(t.is_contiguous(), op, ": columns[", k,
                        "] must be contiguous (it is updated in place)");
      const int64_t cols = c10::multiply_integers(t.sizes().slice(1));
      rows.push_back(t.view({N, cols}));
      D += cols;
    }
    TORCH_CHECK_VALUE(part.dim() == 1, op, ": ", ids_name, " must be 1-D, got shape ",
                      part.sizes());
    check_dtype(part, at::kLong, op, ids_name.c_str());
    const int64_t M = part.size(0);
    TORCH_CHECK_VALUE(buffer.dim() == 2 && buffer.size(0) == M && buffer.size(1) >= D, op, ": ",
                      buffer_name, " must have shape [M, W] with M = ", M, ", W >= ", D,
                      ", got ", buffer.sizes());
    check_dtype(buffer, at::kFloat, op, buffer_name.c_str());
    TORCH_CHECK_VALUE(buffer.device() == part.device(), op, ": ", buffer_name, " is on ",
                      buffer.device(), " but ", ids_name, " is on ", part.device());
    if (M == 0 || !reads_values(part)) {
      continue;
    }
    const auto [lo, hi, increasing] = host_id_stats(part.cpu());
    TORCH_CHECK_VALUE(lo >= 0 && hi < N, op, ": ", ids_name, " out of range: values span [", lo,
                      ", ", hi, "] but must lie in [0, ", N, ")");
    TORCH_CHECK_VALUE(increasing, op, ": ", ids_name, " must be strictly increasing");
  }
  return rows;
}

// accumulate_ready_rows' arguments, every part checked before any is added (mirrors
// reference.accumulate_ready_rows, same messages).
inline void check_accumulate_inputs(const at::Tensor& acc, const at::Tensor& ready,
                                    at::TensorList positions, at::TensorList contribs) {
  const char* op = "accumulate_ready_rows";
  TORCH_CHECK_VALUE(acc.dim() == 2, op, ": acc must have shape [U, W], got ", acc.sizes());
  const int64_t U = acc.size(0);
  const int64_t W = acc.size(1);
  check_shape_1d(ready, U, op, "ready");
  check_dtype(acc, at::kFloat, op, "acc");
  check_dtype(ready, at::kBool, op, "ready");
  TORCH_CHECK_VALUE(positions.size() == contribs.size(), op, ": ", positions.size(),
                    " position lists but ", contribs.size(), " contributions");
  const auto device = acc.device();
  check_device(ready, device, op, "ready");
  check_contiguous(acc, op, "acc");
  for (size_t j = 0; j < positions.size(); ++j) {
    const std::string pos_name = "positions[" + std::to_string(j) + "]";
    const std::string contrib_name = "contribs[" + std::to_string(j) + "]";
    const at::Tensor& pos = positions[j];
    const at::Tensor& contrib = contribs[j];
    TORCH_CHECK_VALUE(pos.dim() == 1, op, ": ", pos_name, " must be 1-D, got shape ",
                      pos.sizes());
    const int64_t M = pos.size(0);
    TORCH_CHECK_VALUE(contrib.dim() == 2 && contrib.size(0) == M && contrib.size(1) == W, op,
                      ": ", contrib_name, " must have shape [", M, ", ", W, "], got ",
                      contrib.sizes());
    check_dtype(contrib, at::kFloat, op, contrib_name.c_str());
    check_device(pos, device, op, pos_name.c_str());
    check_device(contrib, device, op, contrib_name.c_str());
    check_ids(pos, U, op, pos_name.c_str());
  }
}

// Row size d_g = prod(shape[1:]) of each parameter group of apply_ready_rows, after checking
// every argument (mirrors reference.check_apply_inputs, same messages).
inline std::vector<int64_t> check_apply_inputs(
    at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
    const at::Tensor& ids, const at::Tensor& acc, const at::Tensor& ready,
    at::ArrayRef<double> lrs, at::ArrayRef<double> betas, at::ArrayRef<double> eps,
    int64_t step, const at::Tensor& versions) {
  const char* op = "apply_ready_rows";
  const size_t G = params.size();
  TORCH_CHECK_VALUE(G > 0, op, ": params must not be empty");
  TORCH_CHECK_VALUE(exp_avgs.size() == G, op, ": exp_avgs has ", exp_avgs.size(),
                    " entries but there are ", G, " groups");
  TORCH_CHECK_VALUE(exp_avg_sqs.size() == G, op, ": exp_avg_sqs has ", exp_avg_sqs.size(),
                    " entries but there are ", G, " groups");
  TORCH_CHECK_VALUE(lrs.size() == G, op, ": lrs has ", lrs.size(), " entries but there are ",
                    G, " groups");
  TORCH_CHECK_VALUE(betas.size() == 2 * G, op, ": betas has ", betas.size() / 2,
                    " entries but there are ", G, " groups");
  TORCH_CHECK_VALUE(eps.size() == G, op, ": eps has ", eps.size(), " entries but there are ",
                    G, " groups");
  TORCH_CHECK_VALUE(versions.dim() == 1, op, ": versions must have shape [N], got ",
                    versions.sizes());
  check_dtype(versions, at::kLong, op, "versions");
  const int64_t N = versions.size(0);
  const auto device = versions.device();
  std::vector<int64_t> dims;
  dims.reserve(G);
  for (size_t g = 0; g < G; ++g) {
    const auto& p = params[g];
    TORCH_CHECK_VALUE(p.dim() >= 1 && p.size(0) == N, op, ": params[", g,
                      "] must have shape [N, ...] with N = ", N, ", got ", p.sizes());
    TORCH_CHECK_VALUE(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, op,
                      ": params[", g, "] must be float32 or float64, got ",
                      dtype_name(p.scalar_type()));
    for (const auto& [t, name] :
         {std::pair<const at::Tensor&, const char*>{exp_avgs[g], "exp_avgs"},
          {exp_avg_sqs[g], "exp_avg_sqs"}}) {
      TORCH_CHECK_VALUE(t.sizes() == p.sizes(), op, ": ", name, "[", g, "] must have shape ",
                        p.sizes(), " like params[", g, "], got ", t.sizes());
      TORCH_CHECK_VALUE(t.scalar_type() == p.scalar_type(), op, ": ", name, "[", g,
                        "] must be ", dtype_name(p.scalar_type()), ", got ",
                        dtype_name(t.scalar_type()));
    }
    for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{p, "params"},
                                  {exp_avgs[g], "exp_avgs"},
                                  {exp_avg_sqs[g], "exp_avg_sqs"}}) {
      TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, "[", g, "] is on ", t.device(),
                        " but versions is on ", device);
      TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, "[", g,
                        "] must be contiguous (it is updated in place)");
    }
    const double b1 = betas[2 * g];
    const double b2 = betas[2 * g + 1];
    TORCH_CHECK_VALUE(b1 >= 0.0 && b1 < 1.0 && b2 >= 0.0 && b2 < 1.0, op, ": betas[", g,
                      "] must lie in [0, 1), got (", b1, ", ", b2, ")");
    dims.push_back(c10::multiply_integers(p.sizes().slice(1)));
  }
  int64_t total = 1;
  for (const int64_t d : dims) {
    total += d;
  }
  TORCH_CHECK_VALUE(acc.dim() == 2, op, ": acc must have shape [U, W], got ", acc.sizes());
  const int64_t U = acc.size(0);
  TORCH_CHECK_VALUE(acc.size(1) == total, op, ": acc must have ", total, " columns (groups ",
                    at::IntArrayRef(dims), " + the visible flag), got ", acc.size(1));
  check_dtype(acc, at::kFloat, op, "acc");
  check_shape_1d(ready, U, op, "ready");
  check_dtype(ready, at::kBool, op, "ready");
  check_contiguous(versions, op, "versions");
  TORCH_CHECK_VALUE(step >= 0, op, ": step is the 0-based global step, got ", step);
  check_device(ids, device, op, "ids");
  check_device(acc, device, op, "acc");
  check_device(ready, device, op, "ready");
  check_union_ids(ids, U, N, op);
  return dims;
}

// A step's union rows as the ops that read an apply's sums take them (apply_ready_rows,
// record_row_norms): ids [U] int64, acc [U, W] float32, ready [U] bool, contiguous (held
// here), and their data.
struct UnionRows {
  at::Tensor ids_t, acc_t, ready_t;
  const int64_t* ids;
  const float* acc;
  const bool* ready;
  int64_t U, W;
};

inline UnionRows union_rows(const at::Tensor& ids, const at::Tensor& acc,
                            const at::Tensor& ready) {
  UnionRows r{ids.contiguous(), acc.contiguous(), ready.contiguous(), nullptr, nullptr,
              nullptr, acc.size(0), acc.size(1)};
  r.ids = r.ids_t.data_ptr<int64_t>();
  r.acc = r.acc_t.data_ptr<float>();
  r.ready = r.ready_t.data_ptr<bool>();
  return r;
}

// Validated arguments of record_row_norms (mirrors reference.check_record_inputs).
inline void check_record_inputs(const at::Tensor& norms, const at::Tensor& active,
                                const at::Tensor& ids, const at::Tensor& acc,
                                const at::Tensor& ready) {
  const char* op = "record_row_norms";
  TORCH_CHECK_VALUE(norms.dim() == 1, op, ": norms must have shape [N], got ", norms.sizes());
  const int64_t N = norms.size(0);
  check_dtype(norms, at::kFloat, op, "norms");
  check_shape_1d(active, N, op, "active");
  check_dtype(active, at::kBool, op, "active");
  check_contiguous(norms, op, "norms");
  check_contiguous(active, op, "active");
  TORCH_CHECK_VALUE(acc.dim() == 2 && acc.size(1) >= 1, op, ": acc must have shape [U, W], got ",
                    acc.sizes());
  const int64_t U = acc.size(0);
  check_dtype(acc, at::kFloat, op, "acc");
  check_shape_1d(ready, U, op, "ready");
  check_dtype(ready, at::kBool, op, "ready");
  const auto device = norms.device();
  check_device(active, device, op, "active");
  check_device(ids, device, op, "ids");
  check_device(acc, device, op, "acc");
  check_device(ready, device, op, "ready");
  check_union_ids(ids, U, N, op);
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
