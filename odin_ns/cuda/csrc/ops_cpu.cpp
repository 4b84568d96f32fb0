// Schemas of torch.ops.odin.* and their CPU kernels (at::parallel_for, OpenMP).
//
// Semantics, shared with odin_ns/cuda/reference.py (the pure-torch specification):
// - ids may repeat: pack_rows copies a repeated row once per occurrence; unpack_accumulate
//   adds it once per occurrence, in id-list order (like index_add_ on CPU);
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
    const i32x4 alive = (r > zero) & (d > p.near_plane) & (o >= p.opacity_threshold) &
                        ((x - x) == zero) & ((y - y) == zero);
    const f32x4 rr = r + p.margin;
    f32x4 dx = -x > x - p.width ? -x : x - p.width;
    dx = dx > zero ? dx : zero;
    f32x4 dy = -y > y - p.height ? -y : y - p.height;
    dy = dy > zero ? dy : zero;
    const i32x4 k = alive & ((dx * dx + dy * dy) < rr * rr);  // lanes: -1 kept, 0 culled
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

at::Tensor pack_rows_cpu(const at::Tensor& ids_in, at::TensorList tensors) {
  const auto rows = check_pack_inputs(ids_in, tensors);
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
  at::parallel_for(0, M, block, [&](int64_t begin, int64_t end) {
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

// ---- unpack_accumulate ------------------------------------------------------------------

void unpack_accumulate_cpu(const at::Tensor& buffer_in, const at::Tensor& ids_in,
                           const at::Tensor& accum, const at::Tensor& arrivals) {
  check_unpack_inputs(buffer_in, ids_in, accum, arrivals);
  const auto buffer = buffer_in.contiguous();
  const auto ids = ids_in.contiguous();
  const int64_t M = ids.size(0);
  const int64_t N = accum.size(0);
  const int64_t D = accum.size(1);
  if (M == 0) {
    return;
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* buf = buffer.data_ptr<float>();
  float* acc = accum.data_ptr<float>();
  int32_t* arr = arrivals.data_ptr<int32_t>();
  // Each task owns a contiguous range of destination rows and applies the id list in order,
  // so repeated ids are summed in list order (bitwise like index_add_) without atomics.
  const int64_t tasks = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, M / 4096));
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t lo = N * t / tasks;
      const int64_t hi = N * (t + 1) / tasks;
      for (int64_t i = 0; i < M; ++i) {
        const int64_t p = id[i];
        if (p < lo || p >= hi) {
          continue;
        }
        float* a = acc + p * D;
        const float* b = buf + i * D;
        for (int64_t c = 0; c < D; ++c) {
          a[c] += b[c];
        }
        arr[p] += 1;
      }
    }
  });
}

// ---- ready_mask -------------------------------------------------------------------------

at::Tensor ready_mask_cpu(const at::Tensor& arrivals_in, const at::Tensor& expected_in,
                          const at::Tensor& blocked_in) {
  check_ready_inputs(arrivals_in, expected_in, blocked_in);
  const auto arrivals = arrivals_in.contiguous();
  const auto expected = expected_in.contiguous();
  const auto blocked = blocked_in.contiguous();
  const int64_t N = arrivals.size(0);
  auto ready = at::empty({N}, at::kBool);
  const int32_t* a = arrivals.data_ptr<int32_t>();
  const int32_t* e = expected.data_ptr<int32_t>();
  const bool* b = blocked.data_ptr<bool>();
  bool* r = ready.data_ptr<bool>();
  at::parallel_for(0, N, 32768, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      r[i] = (a[i] == e[i]) & (e[i] > 0) & !b[i];
    }
  });
  return ready;
}

// ---- selective_adam_apply ---------------------------------------------------------------

// Moments of the masked rows in [begin, end); writes exp_avg_sq of each updated element,
// in order, to root (the caller takes its square root). Returns the number written.
template <typename T, bool kFma>
inline int64_t adam_moments_rows(const T* grad, T* exp_avg, T* exp_avg_sq, const bool* mask,
                                 int64_t cols, int64_t begin, int64_t end,
                                 const AdamScalars<T>& s, T* root) {
  int64_t k = 0;
  for (int64_t r = begin; r < end; ++r) {
    if (!mask[r]) {
      continue;
    }
    for (int64_t c = r * cols; c < (r + 1) * cols; ++c) {
      adam_moments<T, kFma>(grad[c], exp_avg[c], exp_avg_sq[c], s);
      root[k++] = exp_avg_sq[c];
    }
  }
  return k;
}

#if defined(__x86_64__) || defined(_M_X64)
// Compiled for FMA hardware so std::fma is one instruction; only called when torch itself
// runs its AVX2 / AVX512 kernels (which need FMA).
template <typename T>
__attribute__((target("fma"))) int64_t adam_moments_rows_fma(
    const T* grad, T* exp_avg, T* exp_avg_sq, const bool* mask, int64_t cols, int64_t begin,
    int64_t end, const AdamScalars<T>& s, T* root) {
  return adam_moments_rows<T, true>(grad, exp_avg, exp_avg_sq, mask, cols, begin, end, s, root);
}
#else
template <typename T>
int64_t adam_moments_rows_fma(const T* grad, T* exp_avg, T* exp_avg_sq, const bool* mask,
                              int64_t cols, int64_t begin, int64_t end,
                              const AdamScalars<T>& s, T* root) {
  return adam_moments_rows<T, true>(grad, exp_avg, exp_avg_sq, mask, cols, begin, end, s, root);
}
#endif

void selective_adam_apply_cpu(const at::Tensor& param, const at::Tensor& grad_in,
                              const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                              const at::Tensor& mask_in, const at::Tensor& versions, double lr,
                              double beta1, double beta2, double eps, int64_t step,
                              int64_t new_version) {
  check_adam_inputs(param, grad_in, exp_avg, exp_avg_sq, mask_in, versions, beta1, beta2,
                    step);
  const auto grad = grad_in.contiguous();
  const auto mask = mask_in.contiguous();
  const int64_t N = param.size(0);
  if (N == 0 || param.numel() == 0) {
    // Nothing to update, but the versions of masked rows still advance.
    versions.masked_fill_(mask, new_version);
    return;
  }
  const int64_t cols = param.numel() / N;
  const bool fused = torch_cpu_uses_fma();
  AT_DISPATCH_FLOATING_TYPES(param.scalar_type(), "selective_adam_apply_cpu", [&] {
    const auto s = make_adam_scalars<scalar_t>(lr, beta1, beta2, eps, step);
    scalar_t* p = param.data_ptr<scalar_t>();
    const scalar_t* g = grad.data_ptr<scalar_t>();
    scalar_t* m = exp_avg.data_ptr<scalar_t>();
    scalar_t* v = exp_avg_sq.data_ptr<scalar_t>();
    const bool* k = mask.data_ptr<bool>();
    int64_t* ver = versions.data_ptr<int64_t>();
    // Blocks of rows whose elements stay in cache through the three passes: moments,
    // torch's sqrt on the block's updated elements, parameter update.
    const int64_t block = std::max<int64_t>(1, 4096 / cols);
    at::parallel_for(0, N, block, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> root(static_cast<size_t>(block * cols));
      for (int64_t b0 = begin; b0 < end; b0 += block) {
        const int64_t b1 = std::min(b0 + block, end);
        const int64_t n =
            fused ? adam_moments_rows_fma<scalar_t>(g, m, v, k, cols, b0, b1, s, root.data())
                  : adam_moments_rows<scalar_t, false>(g, m, v, k, cols, b0, b1, s,
                                                       root.data());
        if (n == 0) {
          continue;
        }
        auto roots =
            at::from_blob(root.data(), {n}, at::TensorOptions().dtype(param.scalar_type()));
        roots.sqrt_();
        int64_t j = 0;
        for (int64_t r = b0; r < b1; ++r) {
          if (!k[r]) {
            continue;
          }
          for (int64_t c = r * cols; c < (r + 1) * cols; ++c) {
            p[c] = adam_param<scalar_t>(p[c], m[c], root[j++], s);
          }
          ver[r] = new_version;
        }
      }
    });
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
  m.def("pack_rows(Tensor ids, Tensor[] tensors) -> Tensor");
  m.def("unpack_accumulate(Tensor buffer, Tensor ids, Tensor(a!) accum, Tensor(b!) arrivals)"
        " -> ()");
  m.def("ready_mask(Tensor arrivals, Tensor expected, Tensor blocked) -> Tensor");
  m.def(
      "selective_adam_apply(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, "
      "Tensor(c!) exp_avg_sq, Tensor mask, Tensor(d!) versions, float lr, float beta1, "
      "float beta2, float eps, int step, int new_version) -> ()");
  m.def("validate_reads(Tensor read_ids, Tensor versions, Tensor required) -> Tensor");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("footprint_cull", &footprint_cull_cpu);
  m.impl("pack_rows", &pack_rows_cpu);
  m.impl("unpack_accumulate", &unpack_accumulate_cpu);
  m.impl("ready_mask", &ready_mask_cpu);
  m.impl("selective_adam_apply", &selective_adam_apply_cpu);
  m.impl("validate_reads", &validate_reads_cpu);
}

}  // namespace odin
