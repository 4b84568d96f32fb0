// CUDA kernels of torch.ops.odin.* (launched from ops_cuda.cpp).
//
// Compaction (footprint_cull, validate_reads) is stable: block b owns a fixed piece of
// kCompactPiece elements, counts it, and after an exclusive scan of the counts writes its
// kept elements in order, so results equal the CPU kernels' exactly.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels.h"

namespace odin {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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
  const int64_t* required;
  __device__ bool operator()(int64_t, int64_t i) const {
    return versions[read_ids[i]] < required[i];
  }
};

struct ReadIdValue {
  const int64_t* read_ids;
  __device__ int64_t operator()(int64_t, int64_t i) const { return read_ids[i]; }
};

// ---- row kernels ------------------------------------------------------------------------

__global__ void pack_rows_kernel(const int64_t* ids, int64_t M, int64_t D, PackBatch batch,
                                 float* out) {
  const int64_t total = M * batch.width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / batch.width;
    int64_t c = e % batch.width;
    int k = 0;
    while (c >= batch.cols[k]) {
      c -= batch.cols[k];
      ++k;
    }
    out[i * D + batch.col_begin + (e % batch.width)] = batch.src[k][ids[i] * batch.cols[k] + c];
  }
}

__global__ void unpack_accumulate_kernel(const float* buffer, const int64_t* ids, int64_t M,
                                         int64_t D, float* accum, int32_t* arrivals) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t e = first; e < M * D; e += stride) {
    const int64_t i = e / D;
    atomicAdd(accum + ids[i] * D + (e % D), buffer[e]);
  }
  for (int64_t i = first; i < M; i += stride) {
    atomicAdd(arrivals + ids[i], 1);
  }
}

__global__ void ready_mask_kernel(const int32_t* arrivals, const int32_t* expected,
                                  const bool* blocked, bool* ready, int64_t N) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ready[i] = (arrivals[i] == expected[i]) && (expected[i] > 0) && !blocked[i];
  }
}

template <typename T, bool kFma>
__global__ void selective_adam_kernel(T* param, const T* grad, T* exp_avg, T* exp_avg_sq,
                                      const bool* mask, int64_t* versions, int64_t N,
                                      int64_t cols, AdamScalars<T> s, int64_t new_version) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < N * cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols;
    if (!mask[r]) {
      continue;
    }
    T m = exp_avg[e];
    T v = exp_avg_sq[e];
    adam_moments<T, kFma>(grad[e], m, v, s);
    param[e] = adam_param<T>(param[e], m, fp_sqrt(v), s);
    exp_avg[e] = m;
    exp_avg_sq[e] = v;
    if (e % cols == 0) {
      versions[r] = new_version;
    }
  }
}

template <typename T>
cudaError_t launch_adam(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, const bool* mask,
                        int64_t* versions, int64_t N, int64_t cols, const AdamScalars<T>& s,
                        bool fma, int64_t new_version, cudaStream_t stream) {
  const int grid = grid_for(N * cols);
  if (fma) {
    selective_adam_kernel<T, true><<<grid, kThreads, 0, stream>>>(
        param, grad, exp_avg, exp_avg_sq, mask, versions, N, cols, s, new_version);
  } else {
    selective_adam_kernel<T, false><<<grid, kThreads, 0, stream>>>(
        param, grad, exp_avg, exp_avg_sq, mask, versions, N, cols, s, new_version);
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

cudaError_t pack_rows(const int64_t* ids, int64_t M, int64_t D, const PackBatch& batch,
                      float* out, cudaStream_t stream) {
  pack_rows_kernel<<<grid_for(M * batch.width), kThreads, 0, stream>>>(ids, M, D, batch, out);
  return cudaGetLastError();
}

cudaError_t unpack_accumulate(const float* buffer, const int64_t* ids, int64_t M, int64_t D,
                              float* accum, int32_t* arrivals, cudaStream_t stream) {
  unpack_accumulate_kernel<<<grid_for(M * std::max<int64_t>(D, 1)), kThreads, 0, stream>>>(
      buffer, ids, M, D, accum, arrivals);
  return cudaGetLastError();
}

cudaError_t ready_mask(const int32_t* arrivals, const int32_t* expected, const bool* blocked,
                       bool* ready, int64_t N, cudaStream_t stream) {
  ready_mask_kernel<<<grid_for(N), kThreads, 0, stream>>>(arrivals, expected, blocked, ready,
                                                           N);
  return cudaGetLastError();
}

cudaError_t selective_adam_apply(float* param, const float* grad, float* exp_avg,
                                 float* exp_avg_sq, const bool* mask, int64_t* versions,
                                 int64_t N, int64_t cols, const AdamScalars<float>& s,
                                 bool fma, int64_t new_version, cudaStream_t stream) {
  return launch_adam<float>(param, grad, exp_avg, exp_avg_sq, mask, versions, N, cols, s, fma,
                            new_version, stream);
}

cudaError_t selective_adam_apply(double* param, const double* grad, double* exp_avg,
                                 double* exp_avg_sq, const bool* mask, int64_t* versions,
                                 int64_t N, int64_t cols, const AdamScalars<double>& s,
                                 bool fma, int64_t new_version, cudaStream_t stream) {
  return launch_adam<double>(param, grad, exp_avg, exp_avg_sq, mask, versions, N, cols, s,
                             fma, new_version, stream);
}

cudaError_t validate_count(const int64_t* read_ids, const int64_t* versions,
                           const int64_t* required, int64_t M, int64_t* counts,
                           cudaStream_t stream) {
  const int64_t pieces = (M + kCompactPiece - 1) / kCompactPiece;
  compact_count_kernel<<<static_cast<unsigned>(pieces), kThreads, 0, stream>>>(
      StalePred{read_ids, versions, required}, M, pieces, counts);
  return cudaGetLastError();
}

cudaError_t validate_write(const int64_t* read_ids, const int64_t* versions,
                           const int64_t* required, int64_t M, const int64_t* offsets,
                           int64_t* out, cudaStream_t stream) {
  const int64_t pieces = (M + kCompactPiece - 1) / kCompactPiece;
  compact_write_kernel<<<static_cast<unsigned>(pieces), kThreads, 0, stream>>>(
      StalePred{read_ids, versions, required}, ReadIdValue{read_ids}, M, pieces, offsets, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace odin
