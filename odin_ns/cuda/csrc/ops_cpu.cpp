// Schemas of torch.ops.odin.* and their CPU kernels (at::parallel_for, OpenMP).
//
// Semantics, shared with odin_ns/cuda/reference.py (the pure-torch specification):
// - ids may repeat: pack_rows copies a repeated row once per occurrence;
//   accumulate_ready_rows adds it once per occurrence, in part and list order (like
//   index_add_ on CPU, one part after another); validate_reads reports it once per
//   occurrence; apply_ready_rows and record_row_norms need strictly increasing ids (the
//   engine's sorted union);
// - empty id lists give empty outputs and leave in-place arguments untouched;
// - out-of-range ids raise ValueError before any output is written.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "host.h"
#include "common.h"

namespace odin {
namespace {

constexpr int64_t kPiece = 16384;  // elements per compaction piece

// Exclusive prefix sum of counts in place; returns the total.
int64_t exclusive_scan(std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (auto& c : counts) {
    const int64_t n = c;
    c = total;
    total += n;
  }
  return total;
}

// Writes value(i) for every i in [lo, hi) with keep[i] to out, in order. Branch-free
// (keep is data-dependent) through scratch [hi - lo], then one copy: out holds exactly the
// kept count, so speculative writes must not land there.
template <typename Value>
inline void compact_piece(const uint8_t* keep, int64_t lo, int64_t hi, Value value,
                          int64_t* scratch, int64_t* out) {
  int64_t count = 0;
  for (int64_t i = lo; i < hi; ++i) {
    scratch[count] = value(i);
    count += keep[i];
  }
  std::memcpy(out, scratch, static_cast<size_t>(count) * sizeof(int64_t));
}

// ---- footprint_cull ---------------------------------------------------------------------

// keep[i] = cull_keep(primitive i) for i in [lo, hi); returns the kept count. xy, radii and
// depths point at the view's rows, opacities at the primitives'.
int64_t cull_range(const float* __restrict xy, const float* __restrict radii,
                   const float* __restrict depths, const float* __restrict opacities,
                   int64_t lo, int64_t hi, const CullParams p, uint8_t* __restrict keep) {
  int64_t count = 0;
  int64_t i = lo;
#if defined(__GNUC__) && !defined(__clang__)
  // Four lanes at a time with GCC vector extensions (SSE2 / NEON baseline): the same IEEE
  // operations as cull_keep per lane, without its data-dependent branches.
  typedef float f32x4 __attribute__((vector_size(16)));
  typedef int32_t i32x4 __attribute__((vector_size(16)));
  const f32x4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
  i32x4 kept = {0, 0, 0, 0};
  for (; i + 4 <= hi; i += 4) {
    f32x4 a, b, r, d, o;
    std::memcpy(&a, xy + 2 * i, sizeof(a));
    std::memcpy(&b, xy + 2 * i + 4, sizeof(b));
    std::memcpy(&r, radii + i, sizeof(r));
    std::memcpy(&d, depths + i, sizeof(d));
    std::memcpy(&o, opacities + i, sizeof(o));
    const f32x4 x = __builtin_shuffle(a, b, i32x4{0, 2, 4, 6});
    const f32x4 y = __builtin_shuffle(a, b, i32x4{1, 3, 5, 7});
    const i32x4 alive = (r > zero) & (d >= p.near_plane) & (o >= p.opacity_threshold) &
                        ((x - x) == zero) & ((y - y) == zero);
    // gsplat's image test, same operation order as cull_keep; lanes: -1 kept, 0 culled.
    const i32x4 k = alive & (((x + r) + p.margin) > zero) & (((x - r) - p.margin) < p.width) &
                    (((y + r) + p.margin) > zero) & (((y - r) - p.margin) < p.height);
    for (int j = 0; j < 4; ++j) {
      keep[i + j] = static_cast<uint8_t>(k[j] & 1);
    }
    kept -= k;
  }
  count = static_cast<int64_t>(kept[0]) + kept[1] + kept[2] + kept[3];
#endif
  for (; i < hi; ++i) {
    const bool k = cull_keep(xy[2 * i], xy[2 * i + 1], radii[i], depths[i], opacities[i], p);
    keep[i] = k;
    count += k;
  }
  return count;
}

std::tuple<at::Tensor, at::Tensor> footprint_cull_cpu(
    const at::Tensor& means2d, const at::Tensor& radii, const at::Tensor& depths,
    const at::Tensor& opacities, int64_t width, int64_t height, double margin_px,
    double near_plane, double opacity_threshold) {
  const auto in =
      check_cull_inputs(means2d, radii, depths, opacities, width, height, margin_px);
  const int64_t V = in.num_views;
  const int64_t N = in.num_prims;
  const CullParams params{static_cast<float>(width), static_cast<float>(height),
                          static_cast<float>(margin_px), static_cast<float>(near_plane),
                          static_cast<float>(opacity_threshold)};
  const float* xy = in.means2d.data_ptr<float>();
  const float* rad = in.radii.data_ptr<float>();
  const float* dep = in.depths.data_ptr<float>();
  const float* opa = in.opacities.data_ptr<float>();

  const int64_t pieces = (N + kPiece - 1) / kPiece;  // per view
  std::vector<uint8_t> keep(static_cast<size_t>(V * N));
  std::vector<int64_t> offsets(static_cast<size_t>(V * pieces));
  at::parallel_for(0, V * pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t v = t / pieces;
      const int64_t lo = (t % pieces) * kPiece;
      const int64_t hi = std::min(lo + kPiece, N);
      offsets[t] = cull_range(xy + 2 * v * N, rad + v * N, dep + v * N, opa, lo, hi, params,
                              keep.data() + v * N);
    }
  });
  const int64_t nnz = exclusive_scan(offsets);

  auto indptr = at::empty({V + 1}, at::kLong);
  auto indices = at::empty({nnz}, at::kLong);
  int64_t* ptr = indptr.data_ptr<int64_t>();
  for (int64_t v = 0; v < V; ++v) {
    ptr[v] = pieces > 0 ? offsets[v * pieces] : 0;
  }
  ptr[V] = nnz;
  int64_t* out = indices.data_ptr<int64_t>();
  at::parallel_for(0, V * pieces, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> scratch(kPiece);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t v = t / pieces;
      const int64_t lo = (t % pieces) * kPiece;
      const int64_t hi = std::min(lo + kPiece, N);
      const uint8_t* k = keep.data() + v * N;
      compact_piece(k, lo, hi, [](int64_t n) { return n; }, scratch.data(), out + offsets[t]);
    }
  });
  return {indptr, indices};
}

// ---- pack_rows --------------------------------------------------------------------------

// out[i * D + c] = src[id[i] * C + c] for rows [begin, end), C columns.
template <int C>
inline void copy_rows(float* out, int64_t D, const float* src, const int64_t* id,
                      int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float* s = src + id[i] * C;
    float* o = out + i * D;
    for (int c = 0; c < C; ++c) {
      o[c] = s[c];
    }
  }
}

at::Tensor pack_rows_cpu(const at::Tensor& ids_in, at::TensorList columns) {
  const auto rows = check_pack_inputs(ids_in, columns);
  const auto ids = ids_in.contiguous();
  const int64_t M = ids.size(0);
  const size_t K = rows.size();
  std::vector<const float*> src(K);
  std::vector<int64_t> cols(K);
  std::vector<int64_t> col_offset(K);
  int64_t D = 0;
  for (size_t k = 0; k < K; ++k) {
    src[k] = rows[k].data_ptr<float>();
    cols[k] = rows[k].size(1);
    col_offset[k] = D;
    D += cols[k];
  }
  auto buffer = at::empty({M, D}, at::kFloat);
  if (M == 0 || D == 0) {
    return buffer;
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  float* out = buffer.data_ptr<float>();
  // Blocks of rows small enough that the block's output stays in cache while every
  // tensor writes its columns.
  const int64_t block = std::max<int64_t>(1, 16384 / D);
  // Tasks of at least 64k elements: below that a second thread costs more than it saves.
  const int64_t grain = std::max<int64_t>(block, 65536 / D);
  at::parallel_for(0, M, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b0 = begin; b0 < end; b0 += block) {
      const int64_t b1 = std::min(b0 + block, end);
      for (size_t k = 0; k < K; ++k) {
        const int64_t c = cols[k];
        const float* s = src[k];
        float* o = out + col_offset[k];
        switch (c) {  // splatfacto's narrow groups get unrolled copies
          case 1:
            copy_rows<1>(o, D, s, id, b0, b1);
            break;
          case 3:
            copy_rows<3>(o, D, s, id, b0, b1);
            break;
          case 4:
            copy_rows<4>(o, D, s, id, b0, b1);
            break;
          default:
            for (int64_t i = b0; i < b1; ++i) {
              std::memcpy(o + i * D, s + id[i] * c, static_cast<size_t>(c) * sizeof(float));
            }
        }
      }
    }
  });
  return buffer;
}

// ---- scatter_rows -----------------------------------------------------------------------

void scatter_rows_cpu(at::TensorList columns, at::TensorList ids_in, at::TensorList buffers_in) {
  const auto rows = check_scatter_inputs(columns, ids_in, buffers_in);
  for (size_t j = 0; j < ids_in.size(); ++j) {  // part after part: a later part's row wins
    const auto ids = ids_in[j].contiguous();
    const auto buffer = buffers_in[j].contiguous();
    const int64_t M = ids.size(0);
    const int64_t W = buffer.size(1);
    if (M == 0) {
      continue;
    }
    const int64_t* id = ids.data_ptr<int64_t>();
    const float* in = buffer.data_ptr<float>();
    // Distinct ids (strictly increasing): rows write disjoint memory, in any order.
    at::parallel_for(0, M, std::max<int64_t>(1, 65536 / std::max<int64_t>(W, 1)),
                     [&](int64_t begin, int64_t end) {
      int64_t off = 0;
      for (const auto& t : rows) {
        const int64_t c = t.size(1);
        float* dst = t.data_ptr<float>();
        for (int64_t i = begin; i < end; ++i) {
          std::memcpy(dst + id[i] * c, in + i * W + off, static_cast<size_t>(c) * sizeof(float));
        }
        off += c;
      }
    });
  }
}

// ---- accumulate_ready_rows --------------------------------------------------------------

// a[c] += b[c] for c < W; W known at compile time for the engine's width (splatfacto: 60).
template <int W>
inline void add_row(float* __restrict a, const float* __restrict b, int64_t) {
  for (int c = 0; c < W; ++c) {
    a[c] += b[c];
  }
}
template <>
inline void add_row<0>(float* __restrict a, const float* __restrict b, int64_t w) {
  for (int64_t c = 0; c < w; ++c) {
    a[c] += b[c];
  }
}

// One part of an accumulation: [M] positions and their [M, w] contribution rows.
struct Part {
  const int64_t* pos;
  const float* contrib;
  int64_t M;
};

template <int W>
void accumulate_rows(float* acc, const bool* ready, const std::vector<Part>& parts, int64_t U,
                     int64_t total, int64_t w) {
  // Each task owns a contiguous range of destination rows and walks the parts, and each
  // part's list, in order, so repeated positions add in part and list order (bitwise like
  // one index_add_ per part in turn) without atomics.
  const int64_t tasks =
      std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, total / 2048));
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t lo = U * t / tasks;
      const int64_t hi = U * (t + 1) / tasks;
      for (const Part& part : parts) {
        for (int64_t i = 0; i < part.M; ++i) {
          const int64_t p = part.pos[i];
          if (p >= lo && p < hi && ready[p]) {
            add_row<W>(acc + p * w, part.contrib + i * w, w);
          }
        }
      }
    }
  });
}

void accumulate_ready_rows_cpu(const at::Tensor& acc, const at::Tensor& ready_in,
                               at::TensorList positions_in, at::TensorList contribs_in) {
  check_accumulate_inputs(acc, ready_in, positions_in, contribs_in);
  const int64_t U = acc.size(0);
  const int64_t W = acc.size(1);
  // contiguous copies where needed, alive while the parts point into them
  std::vector<at::Tensor> held;
  std::vector<Part> parts;
  int64_t total = 0;
  for (size_t j = 0; j < positions_in.size(); ++j) {
    const int64_t M = positions_in[j].size(0);
    if (M == 0) {
      continue;
    }
    held.push_back(positions_in[j].contiguous());
    held.push_back(contribs_in[j].contiguous());
    parts.push_back({held[held.size() - 2].data_ptr<int64_t>(),
                     held[held.size() - 1].data_ptr<float>(), M});
    total += M;
  }
  if (total == 0 || W == 0) {
    return;
  }
  const auto ready = ready_in.contiguous();
  float* a = acc.data_ptr<float>();
  const bool* r = ready.data_ptr<bool>();
  if (W == 60) {
    accumulate_rows<60>(a, r, parts, U, total, W);
  } else {
    accumulate_rows<0>(a, r, parts, U, total, W);
  }
}

// ---- apply_ready_rows -------------------------------------------------------------------

// Moments of group rows rows[0..n) (param row ids[rows[k]], gradient acc[rows[k], off:off+d]);
// writes each updated exp_avg_sq, in order, to root (the caller takes its square root).
// One row's moments: d contiguous elements (restrict: the loop vectorizes, with the same
// IEEE operations per element).
template <typename T, bool kFma>
inline __attribute__((always_inline)) void row_moments(const float* __restrict g,
                                                       T* __restrict exp_avg,
                                                       T* __restrict exp_avg_sq,
                                                       T* __restrict root, int64_t d,
                                                       const AdamScalars<T>& s) {
  for (int64_t c = 0; c < d; ++c) {
    T m = exp_avg[c];
    T v = exp_avg_sq[c];
    adam_moments<T, kFma>(static_cast<T>(g[c]), m, v, s);
    exp_avg[c] = m;
    exp_avg_sq[c] = v;
    root[c] = v;
  }
}

template <typename T, bool kFma>
inline __attribute__((always_inline)) void apply_moments(const int64_t* rows, int64_t n,
                                                         const int64_t* ids, const float* acc,
                                                         int64_t W, int64_t off, int64_t d,
                                                         T* exp_avg, T* exp_avg_sq,
                                                         const AdamScalars<T>& s, T* root) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t base = ids[rows[j]] * d;
    row_moments<T, kFma>(acc + rows[j] * W + off, exp_avg + base, exp_avg_sq + base,
                         root + j * d, d, s);
  }
}

// One row's parameter update from sqrt(exp_avg_sq) (vectorizes like row_moments).
template <typename T>
inline void row_param(T* __restrict p, const T* __restrict m, const T* __restrict root,
                      int64_t d, const AdamScalars<T>& s) {
  for (int64_t c = 0; c < d; ++c) {
    p[c] = adam_param<T>(p[c], m[c], root[c], s);
  }
}

#if defined(__x86_64__) || defined(_M_X64)
// Compiled for FMA hardware so std::fma is one instruction; only called when torch itself
// runs its AVX2 / AVX512 kernels (which need FMA).
template <typename T>
__attribute__((target("fma"))) void apply_moments_fma(const int64_t* rows, int64_t n,
                                                      const int64_t* ids, const float* acc,
                                                      int64_t W, int64_t off, int64_t d,
                                                      T* exp_avg, T* exp_avg_sq,
                                                      const AdamScalars<T>& s, T* root) {
  apply_moments<T, true>(rows, n, ids, acc, W, off, d, exp_avg, exp_avg_sq, s, root);
}
#else
template <typename T>
void apply_moments_fma(const int64_t* rows, int64_t n, const int64_t* ids, const float* acc,
                       int64_t W, int64_t off, int64_t d, T* exp_avg, T* exp_avg_sq,
                       const AdamScalars<T>& s, T* root) {
  apply_moments<T, true>(rows, n, ids, acc, W, off, d, exp_avg, exp_avg_sq, s, root);
}
#endif

// Selective Adam of one group on union rows rows[0..n) (all ready and visible).
template <typename T>
void apply_group(const at::Tensor& param, const at::Tensor& exp_avg_t,
                 const at::Tensor& exp_avg_sq_t, const std::vector<int64_t>& rows,
                 const int64_t* ids, const float* acc, int64_t W, int64_t off, int64_t d,
                 const AdamScalars<T>& s, bool fused) {
  T* p = param.data_ptr<T>();
  T* m = exp_avg_t.data_ptr<T>();
  T* v = exp_avg_sq_t.data_ptr<T>();
  const int64_t n = static_cast<int64_t>(rows.size());
  // Blocks of rows whose elements stay in cache through the three passes: moments, torch's
  // sqrt on the block's updated elements (one at::sqrt_ per block), parameter update.
  const int64_t block = std::max<int64_t>(1, 8192 / d);
  at::parallel_for(0, n, block, [&](int64_t begin, int64_t end) {
    std::vector<T> root(static_cast<size_t>(std::min(block, end - begin) * d));
    for (int64_t b0 = begin; b0 < end; b0 += block) {
      const int64_t b1 = std::min(b0 + block, end);
      const int64_t* r = rows.data() + b0;
      if (fused) {
        apply_moments_fma<T>(r, b1 - b0, ids, acc, W, off, d, m, v, s, root.data());
      } else {
        apply_moments<T, false>(r, b1 - b0, ids, acc, W, off, d, m, v, s, root.data());
      }
      auto roots = at::from_blob(root.data(), {(b1 - b0) * d},
                                 at::TensorOptions().dtype(param.scalar_type()));
      roots.sqrt_();
      for (int64_t j = b0; j < b1; ++j) {
        const int64_t base = ids[rows[j]] * d;
        row_param<T>(p + base, m + base, root.data() + (j - b0) * d, d, s);
      }
    }
  });
}

void apply_ready_rows_cpu(at::TensorList params, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, const at::Tensor& ids_in,
                          const at::Tensor& acc_in, const at::Tensor& ready_in,
                          at::ArrayRef<double> lrs, at::ArrayRef<double> betas,
                          at::ArrayRef<double> eps, int64_t step, const at::Tensor& versions) {
  const auto dims = check_apply_inputs(params, exp_avgs, exp_avg_sqs, ids_in, acc_in, ready_in,
                                       lrs, betas, eps, step, versions);
  if (ids_in.size(0) == 0) {
    return;
  }
  const auto in = union_rows(ids_in, acc_in, ready_in);
  const int64_t* ids = in.ids;
  const float* acc = in.acc;
  const bool* ready = in.ready;
  const int64_t U = in.U;
  const int64_t W = in.W;
  int64_t* ver = versions.data_ptr<int64_t>();
  // Ready rows get the version; ready rows some writer saw (visible flag > 0) move.
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(U));
  for (int64_t i = 0; i < U; ++i) {
    if (ready[i]) {
      ver[ids[i]] = step;
      if (acc[i * W + W - 1] > 0.0f) {
        rows.push_back(i);
      }
    }
  }
  if (rows.empty()) {
    return;
  }
  const bool fused = torch_cpu_uses_fma();
  int64_t off = 0;
  for (size_t g = 0; g < params.size(); ++g) {
    const int64_t d = dims[g];
    if (d > 0) {
      AT_DISPATCH_FLOATING_TYPES(params[g].scalar_type(), "apply_ready_rows_cpu", [&] {
        const auto s = make_adam_scalars<scalar_t>(lrs[g], betas[2 * g], betas[2 * g + 1],
                                                   eps[g], step + 1);
        apply_group<scalar_t>(params[g], exp_avgs[g], exp_avg_sqs[g], rows, ids, acc, W, off,
                              d, s, fused);
      });
    }
    off += d;
  }
}

// ---- record_row_norms -------------------------------------------------------------------

void record_row_norms_cpu(const at::Tensor& norms, const at::Tensor& active,
                          const at::Tensor& ids_in, const at::Tensor& acc_in,
                          const at::Tensor& ready_in) {
  check_record_inputs(norms, active, ids_in, acc_in, ready_in);
  if (acc_in.size(0) == 0) {
    return;
  }
  const auto in = union_rows(ids_in, acc_in, ready_in);
  float* norm = norms.data_ptr<float>();
  bool* act = active.data_ptr<bool>();
  // Ids are distinct: tasks write disjoint rows.
  at::parallel_for(0, in.U, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (in.ready[i]) {
        const float* row = in.acc + i * in.W;
        norm[in.ids[i]] = row_norm(row, in.W - 1);
        act[in.ids[i]] = row[in.W - 1] > 0.0f;
      }
    }
  });
}

// ---- validate_reads ---------------------------------------------------------------------

at::Tensor validate_reads_cpu(const at::Tensor& read_ids_in, const at::Tensor& versions_in,
                              const at::Tensor& required_in) {
  check_validate_inputs(read_ids_in, versions_in, required_in);
  const auto read_ids = read_ids_in.contiguous();
  const auto versions = versions_in.contiguous();
  const auto required = required_in.contiguous();
  const int64_t M = read_ids.size(0);
  const int64_t* id = read_ids.data_ptr<int64_t>();
  const int64_t* ver = versions.data_ptr<int64_t>();
  const int64_t* req = required.data_ptr<int64_t>();
  const int64_t pieces = (M + kPiece - 1) / kPiece;
  std::vector<uint8_t> stale(static_cast<size_t>(M));
  std::vector<int64_t> offsets(static_cast<size_t>(pieces));
  at::parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t count = 0;
      const int64_t hi = std::min((t + 1) * kPiece, M);
      for (int64_t i = t * kPiece; i < hi; ++i) {
        const bool s = ver[id[i]] < req[i];
        stale[i] = s;
        count += s;
      }
      offsets[t] = count;
    }
  });
  const int64_t K = exclusive_scan(offsets);
  auto out = at::empty({K}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> scratch(kPiece);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t lo = t * kPiece;
      const int64_t hi = std::min(lo + kPiece, M);
      compact_piece(stale.data(), lo, hi, [id](int64_t i) { return id[i]; }, scratch.data(),
                    o + offsets[t]);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(odin, m) {
  m.def(
      "footprint_cull(Tensor means2d, Tensor radii, Tensor depths, Tensor opacities, "
      "int width, int height, float margin_px, float near_plane, float opacity_threshold)"
      " -> (Tensor, Tensor)");
  m.def("pack_rows(Tensor ids, Tensor[] columns) -> Tensor");
  m.def("scatter_rows(Tensor(a!)[] columns, Tensor[] ids, Tensor[] buffers) -> ()");
  m.def(
      "accumulate_ready_rows(Tensor(a!) acc, Tensor ready, Tensor[] positions, "
      "Tensor[] contribs) -> ()");
  m.def(
      "apply_ready_rows(Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor ids, Tensor acc, Tensor ready, float[] lrs, float[] betas, float[] eps, "
      "int step, Tensor(d!) versions) -> ()");
  m.def(
      "record_row_norms(Tensor(a!) norms, Tensor(b!) active, Tensor ids, Tensor acc, "
      "Tensor ready) -> ()");
  m.def("validate_reads(Tensor read_ids, Tensor versions, Tensor required) -> Tensor");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("footprint_cull", &footprint_cull_cpu);
  m.impl("pack_rows", &pack_rows_cpu);
  m.impl("scatter_rows", &scatter_rows_cpu);
  m.impl("accumulate_ready_rows", &accumulate_ready_rows_cpu);
  m.impl("apply_ready_rows", &apply_ready_rows_cpu);
  m.impl("record_row_norms", &record_row_norms_cpu);
  m.impl("validate_reads", &validate_reads_cpu);
}

}  // namespace odin
