// CUDA kernel launchers (kernels.cu). Plain pointers and sizes only, so kernels.cu needs no
// torch headers and compiles in seconds; ops_cuda.cpp does the checks and allocation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace odin {
namespace cuda {

constexpr int kMaxPackTensors = 16;   // tensors per pack launch (more: several launches)
constexpr int64_t kCompactPiece = 4096;  // elements per block in the compaction kernels

// One launch's worth of row tensors of pack_rows (read) or scatter_rows (written): buffer
// columns [col_begin, col_begin + width) hold tensor k's cols[k] columns side by side.
struct RowBatch {
  float* rows[kMaxPackTensors];  // [N, cols[k]] contiguous
  int64_t cols[kMaxPackTensors];
  int count;
  int64_t col_begin;  // first buffer column of this batch
  int64_t width;      // sum(cols) of this batch
  int64_t num_rows;   // N: every tensor's rows (ids must lie in [0, N))
};

// footprint_cull: counts[b] = kept primitives of block b = (view, piece), b < V * pieces.
cudaError_t cull_count(const float* means2d, const float* radii, const float* depths,
                       const float* opacities, int64_t V, int64_t N, CullParams params,
                       int64_t* counts, cudaStream_t stream);
// footprint_cull: write kept primitive ids, block b starting at offsets[b] (exclusive scan).
cudaError_t cull_write(const float* means2d, const float* radii, const float* depths,
                       const float* opacities, int64_t V, int64_t N, CullParams params,
                       const int64_t* offsets, int64_t* indices, cudaStream_t stream);

// pack_rows: out[i, col_begin + (column c of tensor k)] = rows[k][ids[i], c]; out is [M, D].
cudaError_t pack_rows(const int64_t* ids, int64_t M, int64_t D, const RowBatch& batch,
                      float* out, cudaStream_t stream);

// scatter_rows: rows[k][ids[i], c] = buffer[i, col_begin + (column c of tensor k)]; buffer
// is [M, W].
cudaError_t scatter_rows(const int64_t* ids, int64_t M, int64_t W, const RowBatch& batch,
                         const float* buffer, cudaStream_t stream);

// accumulate_ready_rows: acc[pos[i], c] += contrib[i, c] where ready[pos[i]] (atomics); acc
// is [U, W].
cudaError_t accumulate_ready_rows(float* acc, const bool* ready, const int64_t* positions,
                                  const float* contrib, int64_t M, int64_t U, int64_t W,
                                  cudaStream_t stream);

// apply_ready_rows, one parameter group of N rows: selective Adam of row ids[i] for every
// ready i whose visible flag acc[i, W - 1] > 0, gradient acc[i, off:off + d].
cudaError_t apply_ready_group(float* param, float* exp_avg, float* exp_avg_sq,
                              const int64_t* ids, const float* acc, const bool* ready,
                              int64_t U, int64_t N, int64_t W, int64_t off, int64_t d,
                              const AdamScalars<float>& s, bool fma, cudaStream_t stream);
cudaError_t apply_ready_group(double* param, double* exp_avg, double* exp_avg_sq,
                              const int64_t* ids, const float* acc, const bool* ready,
                              int64_t U, int64_t N, int64_t W, int64_t off, int64_t d,
                              const AdamScalars<double>& s, bool fma, cudaStream_t stream);
// apply_ready_rows: versions[ids[i]] = step for every ready i (versions: [N]).
cudaError_t apply_ready_versions(const int64_t* ids, const bool* ready, int64_t U, int64_t N,
                                 int64_t step, int64_t* versions, cudaStream_t stream);

// record_row_norms: for every ready i, norms[ids[i]] = the L2 norm of acc[i, 0:W-1] (squares
// summed in float64 column after column, rounded to float32), active[ids[i]] = acc[i, W-1] > 0
// (norms and active: [N]).
cudaError_t record_row_norms(float* norms, bool* active, const int64_t* ids, const float* acc,
                             const bool* ready, int64_t U, int64_t N, int64_t W,
                             cudaStream_t stream);

// validate_reads: counts per piece, then write stale ids from offsets (exclusive scan);
// versions: [N].
cudaError_t validate_count(const int64_t* read_ids, const int64_t* versions, int64_t N,
                           const int64_t* required, int64_t M, int64_t* counts,
                           cudaStream_t stream);
cudaError_t validate_write(const int64_t* read_ids, const int64_t* versions, int64_t N,
                           const int64_t* required, int64_t M, const int64_t* offsets,
                           int64_t* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace odin
