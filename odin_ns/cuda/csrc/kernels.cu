// CUDA kernels of torch.ops.odin.* (launched from ops_cuda.cpp).
//
// Compaction (footprint_cull, validate_reads) is stable: block b owns a fixed piece of
// kCompactPiece elements, counts it, and after an exclusive scan of the counts writes its
// kept elements in order, so results equal the CPU kernels' exactly.
//
// Every id a kernel reads a row by is checked against the rows there: one outside them
// stops the kernel with a device-side assertion (check_row), as torch's own index kernels
// do, instead of reading or writing another tensor's memory. (The host reads device ids only
// with ODIN_NS_DEBUG_CHECKS=1: the read would synchronize the stream.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cassert>

#include "kernels.h"

namespace odin {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Stops the kernel (a device-side assertion: the launch's stream reports
// cudaErrorAssert) unless 0 <= id < rows. Not assert(): that one is gone under NDEBUG.
__device__ inline void check_row(int64_t id, int64_t rows) {
  if (id < 0 || id >= rows) {
    __assert_fail("row id out of range", __FILE__, __LINE__, __func__);
  }
}

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 1 << 20));
}

// ---- stable compaction ------------------------------------------------------------------

template <class Pred>
__global__ void compact_count_kernel(Pred pred, int64_t n_per_row, int64_t pieces,
                                     int64_t* counts) {
  const int64_t b = blockIdx.x;
  const int64_t row = b / pieces;
  const int64_t lo = (b % pieces) * kCompactPiece;
  const int64_t hi = lo + kCompactPiece < n_per_row ? lo + kCompactPiece : n_per_row;
  int64_t total = 0;
  for (int64_t base = lo; base < hi; base += kThreads) {
    const int64_t col = base + threadIdx.x;
    total += __syncthreads_count(col < hi && pred(row, col));
  }
  if (threadIdx.x == 0) {
    counts[b] = total;
  }
}

template <class Pred, class Value>
__global__ void compact_write_kernel(Pred pred, Value value, int64_t n_per_row, int64_t pieces,
                                     const int64_t* offsets, int64_t* out) {
  __shared__ int warp_counts[kWarps];
  const int64_t b = blockIdx.x;
  const int64_t row = b / pieces;
  const int64_t lo = (b % pieces) * kCompactPiece;
  const int64_t hi = lo + kCompactPiece < n_per_row ? lo + kCompactPiece : n_per_row;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int64_t o = offsets[b];
  for (int64_t base = lo; base < hi; base += kThreads) {
    const int64_t col = base + threadIdx.x;
    const bool keep = col < hi && pred(row, col);
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) {
      warp_counts[warp] = __popc(ballot);
    }
    __syncthreads();
    int before = 0;
    int total = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int c = warp_counts[w];
      before += w < warp ? c : 0;
      total += c;
    }
    if (keep) {
      out[o + before + __popc(ballot & ((1u << lane) - 1u))] = value(row, col);
    }
    o += total;
    __syncthreads();  // warp_counts is rewritten next iteration
  }
}

struct CullPred {
  const float* means2d;
  const float* radii;
  const float* depths;
  const float* opacities;
  int64_t N;
  CullParams params;
  __device__ bool operator()(int64_t v, int64_t n) const {
    const int64_t i = v * N + n;
    return cull_keep(means2d[2 * i], means2d[2 * i + 1], radii[i], depths[i], opacities[n],
                     params);
  }
};

struct ColumnValue {
  __device__ int64_t operator()(int64_t, int64_t n) const { return n; }
};

struct StalePred {
  const int64_t* read_ids;
  const int64_t* versions;
  int64_t N;  // versions' rows
  const int64_t* required;
  __device__ bool operator()(int64_t, int64_t i) const {
    check_row(read_ids[i], N);
    return versions[read_ids[i]] < required[i];
  }
};

struct ReadIdValue {
  const int64_t* read_ids;
  __device__ int64_t operator()(int64_t, int64_t i) const { return read_ids[i]; }
};

// ---- row kernels ------------------------------------------------------------------------

// Element e of a batch's [M, width] block: its row i, the batch column e % width, and the
// element of tensor k it stands for (row ids[i], column c).
struct RowElement {
  int64_t i;
  int64_t column;  // within the batch
  float* tensor;   // &rows[k][ids[i] * cols[k] + c]
};

__device__ inline RowElement row_element(const RowBatch& batch, const int64_t* ids, int64_t e) {
  const int64_t i = e / batch.width;
  const int64_t column = e % batch.width;
  int64_t c = column;
  int k = 0;
  while (c >= batch.cols[k]) {
    c -= batch.cols[k];
    ++k;
  }
  check_row(ids[i], batch.num_rows);
  return {i, column, batch.rows[k] + ids[i] * batch.cols[k] + c};
}

__global__ void pack_rows_kernel(const int64_t* ids, int64_t M, int64_t D, RowBatch batch,
                                 float* out) {
  const int64_t total = M * batch.width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RowElement el = row_element(batch, ids, e);
    out[el.i * D + batch.col_begin + el.column] = *el.tensor;
  }
}

__global__ void scatter_rows_kernel(const int64_t* ids, int64_t M, int64_t W, RowBatch batch,
                                    const float* buffer) {
  const int64_t total = M * batch.width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RowElement el = row_element(batch, ids, e);
    *el.tensor = buffer[el.i * W + batch.col_begin + el.column];
  }
}

__global__ void accumulate_ready_rows_kernel(float* acc, const bool* ready,
                                             const int64_t* positions, const float* contrib,
                                             int64_t M, int64_t U, int64_t W) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < M * W;
       e += stride) {
    const int64_t p = positions[e / W];
    check_row(p, U);
    if (ready[p]) {
      atomicAdd(acc + p * W + (e % W), contrib[e]);
    }
  }
}

template <typename T, bool kFma>
__global__ void apply_ready_group_kernel(T* param, T* exp_avg, T* exp_avg_sq,
                                         const int64_t* ids, const float* acc,
                                         const bool* ready, int64_t U, int64_t N, int64_t W,
                                         int64_t off, int64_t d, AdamScalars<T> s) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < U * d;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / d;
    const int64_t c = e % d;
    if (!ready[i] || !(acc[i * W + W - 1] > 0.0f)) {
      continue;
    }
    check_row(ids[i], N);
    const int64_t x = ids[i] * d + c;
    T m = exp_avg[x];
    T v = exp_avg_sq[x];
    adam_moments<T, kFma>(static_cast<T>(acc[i * W + off + c]), m, v, s);
    param[x] = adam_param<T>(param[x], m, fp_sqrt(v), s);
    exp_avg[x] = m;
    exp_avg_sq[x] = v;
  }
}

__global__ void apply_ready_versions_kernel(const int64_t* ids, const bool* ready, int64_t U,
                                            int64_t N, int64_t step, int64_t* versions) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < U;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (ready[i]) {
      check_row(ids[i], N);
      versions[ids[i]] = step;
    }
  }
}

// One thread per union row (rows are distinct ids: no two threads write one row); the norm
// is common.h's row_norm, as on the CPU, so both give the same bits.
__global__ void record_row_norms_kernel(float* norms, bool* active, const int64_t* ids,
                                        const float* acc, const bool* ready, int64_t U,
                                        int64_t N, int64_t W) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < U;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (ready[i]) {
      check_row(ids[i], N);
      const float* row = acc + i * W;
      norms[ids[i]] = row_norm(row, W - 1);
      active[ids[i]] = row[W - 1] > 0.0f;
    }
  }
}

template <typename T>
cudaError_t launch_apply_group(T* param, T* exp_avg, T* exp_avg_sq, const int64_t* ids,
                               const float* acc, const bool* ready, int64_t U, int64_t N,
                               int64_t W, int64_t off, int64_t d, const AdamScalars<T>& s,
                               bool fma, cudaStream_t stream) {
  const int grid = grid_for(U * d);
  if (fma) {
    apply_ready_group_kernel<T, true><<<grid, kThreads, 0, stream>>>(
        param, exp_avg, exp_avg_sq, ids, acc, ready, U, N, W, off, d, s);
  } else {
    apply_ready_group_kernel<T, false><<<grid, kThreads, 0, stream>>>(
        param, exp_avg, exp_avg_sq, ids, acc, ready, U, N, W, off, d, s);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t cull_count(const float* means2d, const float* radii, const float* depths,
                       const float* opacities, int64_t V, int64_t N, CullParams params,
                       int64_t* counts, cudaStream_t stream) {
  const int64_t pieces = (N + kCompactPiece - 1) / kCompactPiece;
  const CullPred pred{means2d, radii, depths, opacities, N, params};
  compact_count_kernel<<<static_cast<unsigned>(V * pieces), kThreads, 0, stream>>>(
      pred, N, pieces, counts);
  return cudaGetLastError();
}

cudaError_t cull_write(const float* means2d, const float* radii, const float* depths,
                       const float* opacities, int64_t V, int64_t N, CullParams params,
                       const int64_t* offsets, int64_t* indices, cudaStream_t stream) {
  const int64_t pieces = (N + kCompactPiece - 1) / kCompactPiece;
  const CullPred pred{means2d, radii, depths, opacities, N, params};
  compact_write_kernel<<<static_cast<unsigned>(V * pieces), kThreads, 0, stream>>>(
      pred, ColumnValue{}, N, pieces, offsets, indices);
  return cudaGetLastError();
}

cudaError_t pack_rows(const int64_t* ids, int64_t M, int64_t D, const RowBatch& batch,
                      float* out, cudaStream_t stream) {
  pack_rows_kernel<<<grid_for(M * batch.width), kThreads, 0, stream>>>(ids, M, D, batch, out);
  return cudaGetLastError();
}

cudaError_t scatter_rows(const int64_t* ids, int64_t M, int64_t W, const RowBatch& batch,
                         const float* buffer, cudaStream_t stream) {
  scatter_rows_kernel<<<grid_for(M * batch.width), kThreads, 0, stream>>>(ids, M, W, batch,
                                                                          buffer);
  return cudaGetLastError();
}

cudaError_t accumulate_ready_rows(float* acc, const bool* ready, const int64_t* positions,
                                  const float* contrib, int64_t M, int64_t U, int64_t W,
                                  cudaStream_t stream) {
  accumulate_ready_rows_kernel<<<grid_for(M * W), kThreads, 0, stream>>>(acc, ready, positions,
                                                                         contrib, M, U, W);
  return cudaGetLastError();
}

cudaError_t apply_ready_group(float* param, float* exp_avg, float* exp_avg_sq,
                              const int64_t* ids, const float* acc, const bool* ready,
                              int64_t U, int64_t N, int64_t W, int64_t off, int64_t d,
                              const AdamScalars<float>& s, bool fma, cudaStream_t stream) {
  return launch_apply_group<float>(param, exp_avg, exp_avg_sq, ids, acc, ready, U, N, W, off,
                                 d, s, fma, stream);
}

cudaError_t apply_ready_group(double* param, double* exp_avg, double* exp_avg_sq,
                              const int64_t* ids, const float* acc, const bool* ready,
                              int64_t U, int64_t N, int64_t W, int64_t off, int64_t d,
                              const AdamScalars<double>& s, bool fma, cudaStream_t stream) {
  return launch_apply_group<double>(param, exp_avg, exp_avg_sq, ids, acc, ready, U, N, W, off,
                                 d, s, fma, stream);
}

cudaError_t apply_ready_versions(const int64_t* ids, const bool* ready, int64_t U, int64_t N,
                                 int64_t step, int64_t* versions, cudaStream_t stream) {
  apply_ready_versions_kernel<<<grid_for(U), kThreads, 0, stream>>>(ids, ready, U, N, step,
                                                                     versions);
  return cudaGetLastError();
}

cudaError_t record_row_norms(float* norms, bool* active, const int64_t* ids, const float* acc,
                             const bool* ready, int64_t U, int64_t N, int64_t W,
                             cudaStream_t stream) {
  record_row_norms_kernel<<<grid_for(U), kThreads, 0, stream>>>(norms, active, ids, acc, ready,
                                                                U, N, W);
  return cudaGetLastError();
}

cudaError_t validate_count(const int64_t* read_ids, const int64_t* versions, int64_t N,
                           const int64_t* required, int64_t M, int64_t* counts,
                           cudaStream_t stream) {
  const int64_t pieces = (M + kCompactPiece - 1) / kCompactPiece;
  compact_count_kernel<<<static_cast<unsigned>(pieces), kThreads, 0, stream>>>(
      StalePred{read_ids, versions, N, required}, M, pieces, counts);
  return cudaGetLastError();
}

cudaError_t validate_write(const int64_t* read_ids, const int64_t* versions, int64_t N,
                           const int64_t* required, int64_t M, const int64_t* offsets,
                           int64_t* out, cudaStream_t stream) {
  const int64_t pieces = (M + kCompactPiece - 1) / kCompactPiece;
  compact_write_kernel<<<static_cast<unsigned>(pieces), kThreads, 0, stream>>>(
      StalePred{read_ids, versions, N, required}, ReadIdValue{read_ids}, M, pieces, offsets,
      out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace odin
