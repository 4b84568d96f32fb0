// Host kernels of the ahead-of-time plan (odin_ns.schedule): torch.ops.odin.plan_dependencies
// and torch.ops.odin.view_overlaps. Their specifications are the numpy / scipy twins in
// odin_ns/schedule/plan.py (dependency_pass_reference) and odin_ns/schedule/locality.py
// (view_overlaps_reference); tests/test_schedule.py checks them equal on random plans.
//
// Footprints are CSR [V, N] (indptr [V + 1], indices [nnz], each row sorted and unique),
// int32 or int64 like scipy's; views is [T, R, B] int64.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(odin, m) {
  m.def(
      "plan_dependencies(Tensor indptr, Tensor indices, Tensor views, int num_cols, "
      "int window) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("view_overlaps(Tensor indptr, Tensor indices, int num_cols) -> Tensor");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("plan_dependencies", &plan_dependencies_cpu);
  m.impl("view_overlaps", &view_overlaps_cpu);
}

}  // namespace odin
