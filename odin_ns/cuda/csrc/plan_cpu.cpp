// Host kernels of phase starts: torch.ops.odin.plan_dependencies and view_overlaps (the
// ahead-of-time plan, odin_ns.schedule) and footprint_slack (footprint reuse,
// odin_ns.distributed.phase). Their specifications are the numpy / scipy / torch twins:
// plan.dependency_pass_reference and locality.view_overlaps_reference (checked equal on
// random plans in tests/test_schedule.py), phase.footprint_slack_reference (bitwise equal,
// tests/test_phase.py).
//
// Footprints are CSR [V, N] (indptr [V + 1], indices [nnz], each row sorted and unique),
// int32 or int64 like scipy's; views is [T, R, B] int64.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "host.h"

namespace odin {
namespace {

void check_csr(const at::Tensor& indptr, const at::Tensor& indices, int64_t num_cols,
               const char* op) {
  TORCH_CHECK_VALUE(indptr.device().is_cpu() && indices.device().is_cpu(), op,
                    ": footprints must be host tensors");
  TORCH_CHECK_VALUE(indptr.dim() == 1 && indptr.size(0) >= 1, op,
                    ": indptr must have shape [V + 1], got ", indptr.sizes());
  TORCH_CHECK_VALUE(indices.dim() == 1, op, ": indices must have shape [nnz], got ",
                    indices.sizes());
  TORCH_CHECK_VALUE(indptr.scalar_type() == indices.scalar_type() &&
                        (indptr.scalar_type() == at::kInt || indptr.scalar_type() == at::kLong),
                    op, ": indptr and indices must both be torch.int32 or both torch.int64, got ",
                    dtype_name(indptr.scalar_type()), " and ", dtype_name(indices.scalar_type()));
  TORCH_CHECK_VALUE(num_cols >= 0, op, ": num_cols must be >= 0, got ", num_cols);
}

// Every primitive id in [0, num_cols), checked once before the passes.
template <typename I>
void check_columns(const I* indices, int64_t nnz, int64_t num_cols, const char* op) {
  I lo = 0;
  I hi = 0;
  for (int64_t i = 0; i < nnz; ++i) {
    lo = std::min(lo, indices[i]);
    hi = std::max(hi, indices[i]);
  }
  TORCH_CHECK_VALUE(lo >= 0 && (nnz == 0 || static_cast<int64_t>(hi) < num_cols), op,
                    ": primitive ids must be in [0, ", num_cols, "), got [", lo, ", ", hi, "]");
}

// Rows of CSR row v: [begin, end) of indices.
template <typename I>
inline std::pair<const I*, const I*> csr_row(const I* indptr, const I* indices, int64_t v) {
  return {indices + indptr[v], indices + indptr[v + 1]};
}

// ---- plan_dependencies --------------------------------------------------------------------

// One rank's read set at one step: the union of its B views' rows (B = 1: the row), each
// row once, in no particular order (the passes only take maxima and counts). ``stamp`` [N]
// holds, per primitive, the last ``key`` (one per (step, rank)) that listed it.
template <typename I>
void read_set(const I* indptr, const I* indices, const int64_t* views, int64_t B, int64_t key,
              std::vector<int64_t>& stamp, std::vector<int64_t>& out) {
  out.clear();
  if (B == 1) {
    auto [lo, hi] = csr_row(indptr, indices, views[0]);
    out.insert(out.end(), lo, hi);
    return;
  }
  for (int64_t b = 0; b < B; ++b) {
    auto [lo, hi] = csr_row(indptr, indices, views[b]);
    for (const I* p = lo; p < hi; ++p) {
      if (stamp[*p] != key) {
        stamp[*p] = key;
        out.push_back(*p);
      }
    }
  }
}

template <typename I>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> plan_dependencies_impl(
    const I* indptr, const I* indices, int64_t V, const at::Tensor& views_t, int64_t num_cols,
    int64_t window) {
  const int64_t T = views_t.size(0);
  const int64_t R = views_t.size(1);
  const int64_t B = views_t.size(2);
  const int64_t* views = views_t.data_ptr<int64_t>();
  for (int64_t i = 0; i < views_t.numel(); ++i) {
    TORCH_CHECK_VALUE(views[i] >= 0 && views[i] < V, "plan_dependencies: view ", views[i],
                      " outside [0, ", V, ")");
  }
  check_columns(indices, static_cast<int64_t>(indptr[V]), num_cols, "plan_dependencies");
  auto dep = at::full({T, R, R}, -1, at::kLong);
  auto rows = at::zeros({T, R, R}, at::kLong);
  auto msg = at::zeros({T, R}, at::kLong);
  auto conflict = at::zeros({T, R}, at::kLong);
  int64_t* dep_p = dep.data_ptr<int64_t>();
  int64_t* rows_p = rows.data_ptr<int64_t>();
  int64_t* msg_p = msg.data_ptr<int64_t>();
  int64_t* conflict_p = conflict.data_ptr<int64_t>();
  // last[p * R + q]: the latest step < t at which rank q wrote primitive p (-1: never). One
  // primitive's R entries share a cache line, so a read set's gathers touch one line a row.
  std::vector<int32_t> last(static_cast<size_t>(num_cols * R), -1);
  std::vector<std::vector<int64_t>> reads(static_cast<size_t>(R));
  std::vector<int64_t> stamp(static_cast<size_t>(B > 1 ? num_cols : 0), -1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t r = 0; r < R; ++r) {
      read_set(indptr, indices, views + (t * R + r) * B, B, t * R + r, stamp, reads[r]);
    }
    const int32_t recent = static_cast<int32_t>(std::max<int64_t>(t - window, 0));
    // Reads of step t (every rank against the writes of steps < t), ranks in parallel.
    at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
      std::vector<int32_t> latest(static_cast<size_t>(R));
      std::vector<int64_t> count(static_cast<size_t>(R));
      for (int64_t r = begin; r < end; ++r) {
        const auto& read = reads[r];
        std::fill(latest.begin(), latest.end(), -1);
        std::fill(count.begin(), count.end(), 0);
        // Two branch-free passes: each peer's latest write of any row, then how many rows
        // have it (and how many rows a peer wrote in the last `window` steps).
        int64_t conflicts = 0;
        for (const int64_t p : read) {
          const int32_t* seen = last.data() + p * R;
          int32_t peer_latest = -1;
          for (int64_t q = 0; q < R; ++q) {
            latest[q] = std::max(latest[q], seen[q]);
            peer_latest = std::max(peer_latest, q == r ? int32_t{-1} : seen[q]);
          }
          conflicts += peer_latest >= recent;
        }
        for (const int64_t p : read) {
          const int32_t* seen = last.data() + p * R;
          for (int64_t q = 0; q < R; ++q) {
            count[q] += seen[q] == latest[q];
          }
        }
        const int64_t at = t * R + r;
        msg_p[at] = static_cast<int64_t>(read.size());
        conflict_p[at] = conflicts;
        for (int64_t q = 0; q < R; ++q) {
          if (q != r && latest[q] >= 0) {
            dep_p[at * R + q] = latest[q];
            rows_p[at * R + q] = count[q];
          }
        }
      }
    });
    // Writes of step t, after all of its reads.
    at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (const int64_t p : reads[r]) {
          last[p * R + r] = static_cast<int32_t>(t);
        }
      }
    });
  }
  return {dep, rows, msg, conflict};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> plan_dependencies_cpu(
    const at::Tensor& indptr_in, const at::Tensor& indices_in, const at::Tensor& views_in,
    int64_t num_cols, int64_t window) {
  check_csr(indptr_in, indices_in, num_cols, "plan_dependencies");
  TORCH_CHECK_VALUE(views_in.dim() == 3 && views_in.scalar_type() == at::kLong, 
                    "plan_dependencies: views must be [T, R, B] torch.int64, got ",
                    views_in.sizes(), " ", dtype_name(views_in.scalar_type()));
  TORCH_CHECK_VALUE(window >= 1, "plan_dependencies: window must be >= 1, got ", window);
  TORCH_CHECK_VALUE(views_in.size(0) < (int64_t{1} << 31), "plan_dependencies: too many steps");
  const auto indptr = indptr_in.contiguous();
  const auto indices = indices_in.contiguous();
  const auto views = views_in.contiguous();
  const int64_t V = indptr.size(0) - 1;
  if (indptr.scalar_type() == at::kInt) {
    return plan_dependencies_impl(indptr.data_ptr<int32_t>(), indices.data_ptr<int32_t>(), V,
                                  views, num_cols, window);
  }
  return plan_dependencies_impl(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), V,
                                views, num_cols, window);
}

// ---- view_overlaps ----------------------------------------------------------------------

// counts[a * V + b] = |F_a & F_b| (the diagonal: |F_a|), from the primitives' view lists:
// sum_p deg(p)^2 increments, like the sparse product F @ F.T, without its hashing.
template <typename I>
at::Tensor view_overlaps_impl(const I* indptr, const I* indices, int64_t V, int64_t num_cols) {
  const int64_t nnz = static_cast<int64_t>(indptr[V]);
  check_columns(indices, nnz, num_cols, "view_overlaps");
  std::vector<int64_t> colptr(static_cast<size_t>(num_cols + 1), 0);
  for (int64_t i = 0; i < nnz; ++i) {
    ++colptr[static_cast<int64_t>(indices[i]) + 1];
  }
  for (int64_t p = 0; p < num_cols; ++p) {
    colptr[p + 1] += colptr[p];
  }
  // Views of each primitive, ascending (rows are visited in order).
  std::vector<int32_t> seen_by(static_cast<size_t>(nnz));
  std::vector<int64_t> fill(colptr.begin(), colptr.end() - 1);
  for (int64_t v = 0; v < V; ++v) {
    for (I i = indptr[v]; i < indptr[v + 1]; ++i) {
      seen_by[fill[indices[i]]++] = static_cast<int32_t>(v);
    }
  }
  auto out = at::zeros({V, V}, at::kLong);
  int64_t* c = out.data_ptr<int64_t>();
  for (int64_t p = 0; p < num_cols; ++p) {
    const int32_t* lo = seen_by.data() + colptr[p];
    const int32_t* hi = seen_by.data() + colptr[p + 1];
    for (const int32_t* a = lo; a < hi; ++a) {
      int64_t* row = c + static_cast<int64_t>(*a) * V;
      for (const int32_t* b = a; b < hi; ++b) {
        ++row[*b];
      }
    }
  }
  for (int64_t a = 0; a < V; ++a) {  // mirror the upper triangle
    for (int64_t b = a + 1; b < V; ++b) {
      c[b * V + a] = c[a * V + b];
    }
  }
  return out;
}

at::Tensor view_overlaps_cpu(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                             int64_t num_cols) {
  check_csr(indptr_in, indices_in, num_cols, "view_overlaps");
  const auto indptr = indptr_in.contiguous();
  const auto indices = indices_in.contiguous();
  const int64_t V = indptr.size(0) - 1;
  if (indptr.scalar_type() == at::kInt) {
    return view_overlaps_impl(indptr.data_ptr<int32_t>(), indices.data_ptr<int32_t>(), V,
                              num_cols);
  }
  return view_overlaps_impl(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), V,
                            num_cols);
}

// ---- footprint_slack --------------------------------------------------------------------

// phase.footprint_slack_reference, one (view, Gaussian) pair at a time: the same float32
// operations in the same order (no contraction: -ffp-contract=off), so the same bits.
at::Tensor footprint_slack_cpu(const at::Tensor& means_in, const at::Tensor& smax_in,
                               const at::Tensor& viewmats_in, const at::Tensor& consts_in,
                               const at::Tensor& indptr_in, const at::Tensor& indices_in,
                               double margin_px, double tol_px, double near) {
  const char* op = "footprint_slack";
  TORCH_CHECK_VALUE(means_in.device().is_cpu(), op, ": inputs must be host tensors");
  check_dtype(means_in, at::kFloat, op, "means");
  check_dtype(smax_in, at::kFloat, op, "smax");
  check_dtype(viewmats_in, at::kFloat, op, "viewmats");
  check_dtype(consts_in, at::kFloat, op, "consts");
  const int64_t N = means_in.size(0);
  TORCH_CHECK_VALUE(means_in.dim() == 2 && means_in.size(1) == 3, op,
                    ": means must be [N, 3], got ", means_in.sizes());
  check_shape_1d(smax_in, N, op, "smax");
  const int64_t V = viewmats_in.size(0);
  TORCH_CHECK_VALUE(viewmats_in.dim() == 3 && viewmats_in.size(1) == 4 &&
                        viewmats_in.size(2) == 4, op, ": viewmats must be [V, 4, 4], got ",
                    viewmats_in.sizes());
  TORCH_CHECK_VALUE(consts_in.dim() == 2 && consts_in.size(0) == V && consts_in.size(1) == 8,
                    op, ": consts must be [V, 8], got ", consts_in.sizes());
  check_csr(indptr_in, indices_in, N, op);
  TORCH_CHECK_VALUE(indptr_in.size(0) == V + 1, op, ": indptr must have V + 1 = ", V + 1,
                    " entries, got ", indptr_in.size(0));
  const auto means = means_in.contiguous();
  const auto smax = smax_in.contiguous();
  const auto viewmats = viewmats_in.contiguous();
  const auto consts = consts_in.contiguous();
  const auto indptr = indptr_in.to(at::kLong).contiguous();
  const auto indices = indices_in.to(at::kLong).contiguous();
  const int64_t* ip = indptr.data_ptr<int64_t>();
  const int64_t* ix = indices.data_ptr<int64_t>();
  check_columns(ix, ip[V], N, op);
  const float* m = means.data_ptr<float>();
  const float* sm = smax.data_ptr<float>();
  const float* vm = viewmats.data_ptr<float>();
  const float* cs = consts.data_ptr<float>();
  const float margin = static_cast<float>(margin_px);
  const float tol = static_cast<float>(tol_px);
  const float nearf = static_cast<float>(near);
  const float shrink = static_cast<float>(1.0 - 1e-6);
  const float inf = std::numeric_limits<float>::infinity();
  auto out = at::full({N}, inf, at::kFloat);
  float* slack = out.data_ptr<float>();
  at::parallel_for(0, N, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t v = 0; v < V; ++v) {
      const float* R = vm + v * 16;  // row-major [4, 4]: rotation R[j * 4 + k], t = R[j * 4 + 3]
      const float* c = cs + v * 8;  // fx, fy, cx, cy, width, height, j2, max(fx, fy)
      const float fx = c[0], fy = c[1], cx = c[2], cy = c[3], w = c[4], h = c[5], j2 = c[6];
      const float f = c[7];
      const float sqrt_j2 = std::sqrt(j2);
      // the view's footprint rows from `begin` on (sorted): membership by a moving pointer
      const int64_t* held = std::lower_bound(ix + ip[v], ix + ip[v + 1], begin);
      const int64_t* held_end = ix + ip[v + 1];
      for (int64_t i = begin; i < end; ++i) {
        if (held < held_end && *held == i) {
          ++held;  // a view whose footprint holds the Gaussian keeps holding it
          continue;
        }
        const float mx = m[3 * i], my = m[3 * i + 1], mz = m[3 * i + 2];
        const float x = R[0] * mx + R[1] * my + R[2] * mz + R[3];
        const float y = R[4] * mx + R[5] * my + R[6] * mz + R[7];
        const float z = R[8] * mx + R[9] * my + R[10] * mz + R[11];
        const bool front = z > nearf;
        const float zs = front ? z : 1.0f;
        const float s = sm[i];
        const float radius = 3.0f * std::sqrt(s * s * (j2 / (zs * zs)) + 0.4f) + 1.01f + margin;
        const float miss_u = std::abs(fx * x / zs + cx - 0.5f * w) - 0.5f * w - radius;
        const float miss_v = std::abs(fy * y / zs + cy - 0.5f * h) - 0.5f * h - radius;
        const float d = std::max(std::max(miss_u, miss_v), 0.0f) + tol;
        const float a = std::max(std::abs(x), std::abs(y)) / zs;
        const float k = f * std::sqrt(1.0f + a * a) + sqrt_j2 * (1.0f + 3.0f * s / zs);
        float bound = std::min(d * zs / (k + d), (zs - nearf) * shrink);
        if (!front) {
          bound = (nearf - z) * shrink;
        }
        slack[i] = std::min(slack[i], bound);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(odin, m) {
  m.def(
      "plan_dependencies(Tensor indptr, Tensor indices, Tensor views, int num_cols, "
      "int window) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("view_overlaps(Tensor indptr, Tensor indices, int num_cols) -> Tensor");
  m.def(
      "footprint_slack(Tensor means, Tensor smax, Tensor viewmats, Tensor consts, "
      "Tensor indptr, Tensor indices, float margin_px, float tol_px, float near) -> Tensor");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("plan_dependencies", &plan_dependencies_cpu);
  m.impl("view_overlaps", &view_overlaps_cpu);
  m.impl("footprint_slack", &footprint_slack_cpu);
}

}  // namespace odin
