// CUDA implementations of torch.ops.odin.* (schemas in ops_cpu.cpp): checks, allocation
// and scans here, kernels in kernels.cu.
//
// Same semantics as the CPU kernels, with three documented differences:
// accumulate_ready_rows adds with atomics, so repeated positions are summed in an unspecified
// order (equal to the CPU result up to float rounding; exact when positions are unique, as
// the engine's are, but for subnormal values: a float atomicAdd on global memory flushes
// subnormal inputs and results to zero, PTX ISA, atom.add.f32; every GPU replica flushes
// alike); apply_ready_rows takes the IEEE square root where torch's CPU kernel may use MKL's;
// an id outside its tensor's rows stops the kernel with a device-side assertion (kernels.cu)
// where the CPU kernels raise before writing.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "host.h"
#include "kernels.h"

namespace odin {
namespace {

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

// Exclusive offsets of per-block counts and their total (one device->host copy).
std::pair<at::Tensor, int64_t> exclusive_offsets(const at::Tensor& counts,
                                                 at::Tensor* inclusive_out) {
  if (counts.numel() == 0) {
    if (inclusive_out != nullptr) {
      *inclusive_out = counts;
    }
    return {counts, 0};
  }
  auto inclusive = counts.cumsum(0);
  const int64_t total = inclusive[-1].item<int64_t>();
  if (inclusive_out != nullptr) {
    *inclusive_out = inclusive;
  }
  return {inclusive - counts, total};
}

std::tuple<at::Tensor, at::Tensor> footprint_cull_cuda(
    const at::Tensor& means2d, const at::Tensor& radii, const at::Tensor& depths,
    const at::Tensor& opacities, int64_t width, int64_t height, double margin_px,
    double near_plane, double opacity_threshold) {
  const auto in =
      check_cull_inputs(means2d, radii, depths, opacities, width, height, margin_px);
  const c10::cuda::CUDAGuard guard(means2d.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t V = in.num_views;
  const int64_t N = in.num_prims;
  const CullParams params{static_cast<float>(width), static_cast<float>(height),
                          static_cast<float>(margin_px), static_cast<float>(near_plane),
                          static_cast<float>(opacity_threshold)};
  const auto long_opts = means2d.options().dtype(at::kLong);
  const int64_t pieces = (N + cuda::kCompactPiece - 1) / cuda::kCompactPiece;
  auto counts = at::empty({V * pieces}, long_opts);
  const float* xy = in.means2d.data_ptr<float>();
  const float* rad = in.radii.data_ptr<float>();
  const float* dep = in.depths.data_ptr<float>();
  const float* opa = in.opacities.data_ptr<float>();
  if (V * pieces > 0) {
    check_launch(cuda::cull_count(xy, rad, dep, opa, V, N, params, counts.data_ptr<int64_t>(),
                                  stream),
                 "footprint_cull");
  }
  at::Tensor inclusive;
  auto [offsets, nnz] = exclusive_offsets(counts, &inclusive);
  auto indices = at::empty({nnz}, long_opts);
  auto indptr = at::zeros({V + 1}, long_opts);
  if (V * pieces > 0) {
    check_launch(cuda::cull_write(xy, rad, dep, opa, V, N, params,
                                  offsets.data_ptr<int64_t>(), indices.data_ptr<int64_t>(),
                                  stream),
                 "footprint_cull");
    indptr.slice(0, 1).copy_(inclusive.view({V, pieces}).select(1, pieces - 1));
  }
  return {indptr, indices};
}

// Calls launch(batch) for each batch of at most kMaxPackTensors [N, cols] row tensors, their
// buffer columns in order (batches of zero width skipped).
template <typename Launch>
void for_each_row_batch(const std::vector<at::Tensor>& rows, Launch launch) {
  int64_t col = 0;
  for (size_t first = 0; first < rows.size(); first += cuda::kMaxPackTensors) {
    cuda::RowBatch batch{};
    batch.col_begin = col;
    batch.count = static_cast<int>(
        std::min<size_t>(cuda::kMaxPackTensors, rows.size() - first));
    for (int k = 0; k < batch.count; ++k) {
      batch.rows[k] = rows[first + k].data_ptr<float>();
      batch.cols[k] = rows[first + k].size(1);
      batch.width += batch.cols[k];
    }
    batch.num_rows = rows[first].size(0);  // (one N for all: check_columns)
    col += batch.width;
    if (batch.width > 0) {
      launch(batch);
    }
  }
}

at::Tensor pack_rows_cuda(const at::Tensor& ids_in, at::TensorList columns) {
  const auto rows = check_pack_inputs(ids_in, columns);
  const c10::cuda::CUDAGuard guard(ids_in.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto ids = ids_in.contiguous();
  const int64_t M = ids.size(0);
  int64_t D = 0;
  for (const auto& t : rows) {
    D += t.size(1);
  }
  auto buffer = at::empty({M, D}, ids.options().dtype(at::kFloat));
  if (M == 0 || D == 0) {
    return buffer;
  }
  for_each_row_batch(rows, [&](const cuda::RowBatch& batch) {
    check_launch(cuda::pack_rows(ids.data_ptr<int64_t>(), M, D, batch,
                                 buffer.data_ptr<float>(), stream),
                 "pack_rows");
  });
  return buffer;
}

void scatter_rows_cuda(at::TensorList columns, at::TensorList ids_in,
                       at::TensorList buffers_in) {
  const auto rows = check_scatter_inputs(columns, ids_in, buffers_in);
  if (ids_in.empty()) {
    return;
  }
  const c10::cuda::CUDAGuard guard(ids_in[0].device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  for (size_t j = 0; j < ids_in.size(); ++j) {  // in stream order: a later part's row wins
    const auto ids = ids_in[j].contiguous();
    const auto buffer = buffers_in[j].contiguous();
    const int64_t M = ids.size(0);
    if (M == 0) {
      continue;
    }
    for_each_row_batch(rows, [&](const cuda::RowBatch& batch) {
      check_launch(cuda::scatter_rows(ids.data_ptr<int64_t>(), M, buffer.size(1), batch,
                                      buffer.data_ptr<float>(), stream),
                   "scatter_rows");
    });
  }
}

void accumulate_ready_rows_cuda(const at::Tensor& acc, const at::Tensor& ready_in,
                                at::TensorList positions_in, at::TensorList contribs_in) {
  check_accumulate_inputs(acc, ready_in, positions_in, contribs_in);
  const int64_t W = acc.size(1);
  if (W == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(acc.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto ready = ready_in.contiguous();
  // one launch per part, queued from here: the caller dispatches once for the step's parts
  for (size_t j = 0; j < positions_in.size(); ++j) {
    const int64_t M = positions_in[j].size(0);
    if (M == 0) {
      continue;
    }
    const auto positions = positions_in[j].contiguous();
    const auto contrib = contribs_in[j].contiguous();
    check_launch(cuda::accumulate_ready_rows(acc.data_ptr<float>(), ready.data_ptr<bool>(),
                                             positions.data_ptr<int64_t>(),
                                             contrib.data_ptr<float>(), M, acc.size(0), W,
                                             stream),
                 "accumulate_ready_rows");
  }
}

void apply_ready_rows_cuda(at::TensorList params, at::TensorList exp_avgs,
                           at::TensorList exp_avg_sqs, const at::Tensor& ids_in,
                           const at::Tensor& acc_in, const at::Tensor& ready_in,
                           at::ArrayRef<double> lrs, at::ArrayRef<double> betas,
                           at::ArrayRef<double> eps, int64_t step, const at::Tensor& versions) {
  const auto dims = check_apply_inputs(params, exp_avgs, exp_avg_sqs, ids_in, acc_in, ready_in,
                                       lrs, betas, eps, step, versions);
  if (ids_in.size(0) == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(versions.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto in = union_rows(ids_in, acc_in, ready_in);
  const int64_t U = in.U;
  const int64_t W = in.W;
  // Same multiply-add fusion as the CPU op on this host, so the two agree (up to the
  // square root, which is IEEE here and torch's (MKL) on the CPU).
  const bool fma = torch_cpu_uses_fma();
  int64_t off = 0;
  for (size_t g = 0; g < params.size(); ++g) {
    const int64_t d = dims[g];
    if (d > 0) {
      cudaError_t err;
      if (params[g].scalar_type() == at::kFloat) {
        err = cuda::apply_ready_group(
            params[g].data_ptr<float>(), exp_avgs[g].data_ptr<float>(),
            exp_avg_sqs[g].data_ptr<float>(), in.ids, in.acc, in.ready, U, params[g].size(0), W,
            off, d,
            make_adam_scalars<float>(lrs[g], betas[2 * g], betas[2 * g + 1], eps[g], step + 1),
            fma, stream);
      } else {
        err = cuda::apply_ready_group(
            params[g].data_ptr<double>(), exp_avgs[g].data_ptr<double>(),
            exp_avg_sqs[g].data_ptr<double>(), in.ids, in.acc, in.ready, U, params[g].size(0),
            W, off, d,
            make_adam_scalars<double>(lrs[g], betas[2 * g], betas[2 * g + 1], eps[g], step + 1),
            fma, stream);
      }
      check_launch(err, "apply_ready_rows");
    }
    off += d;
  }
  check_launch(cuda::apply_ready_versions(in.ids, in.ready, U, versions.size(0), step,
                                          versions.data_ptr<int64_t>(), stream),
               "apply_ready_rows");
}

void record_row_norms_cuda(const at::Tensor& norms, const at::Tensor& active,
                           const at::Tensor& ids_in, const at::Tensor& acc_in,
                           const at::Tensor& ready_in) {
  check_record_inputs(norms, active, ids_in, acc_in, ready_in);
  if (acc_in.size(0) == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(norms.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto in = union_rows(ids_in, acc_in, ready_in);
  check_launch(cuda::record_row_norms(norms.data_ptr<float>(), active.data_ptr<bool>(), in.ids,
                                      in.acc, in.ready, in.U, norms.size(0), in.W, stream),
               "record_row_norms");
}

at::Tensor validate_reads_cuda(const at::Tensor& read_ids_in, const at::Tensor& versions_in,
                               const at::Tensor& required_in) {
  check_validate_inputs(read_ids_in, versions_in, required_in);
  const c10::cuda::CUDAGuard guard(versions_in.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto read_ids = read_ids_in.contiguous();
  const auto versions = versions_in.contiguous();
  const auto required = required_in.contiguous();
  const int64_t M = read_ids.size(0);
  const auto long_opts = versions.options();
  const int64_t pieces = (M + cuda::kCompactPiece - 1) / cuda::kCompactPiece;
  auto counts = at::empty({pieces}, long_opts);
  if (pieces > 0) {
    check_launch(cuda::validate_count(read_ids.data_ptr<int64_t>(),
                                      versions.data_ptr<int64_t>(), versions.size(0),
                                      required.data_ptr<int64_t>(), M,
                                      counts.data_ptr<int64_t>(), stream),
                 "validate_reads");
  }
  auto [offsets, total] = exclusive_offsets(counts, nullptr);
  auto out = at::empty({total}, long_opts);
  if (total > 0) {
    check_launch(cuda::validate_write(read_ids.data_ptr<int64_t>(),
                                      versions.data_ptr<int64_t>(), versions.size(0),
                                      required.data_ptr<int64_t>(), M,
                                      offsets.data_ptr<int64_t>(), out.data_ptr<int64_t>(),
                                      stream),
                 "validate_reads");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(odin, CUDA, m) {
  m.impl("footprint_cull", &footprint_cull_cuda);
  m.impl("pack_rows", &pack_rows_cuda);
  m.impl("scatter_rows", &scatter_rows_cuda);
  m.impl("accumulate_ready_rows", &accumulate_ready_rows_cuda);
  m.impl("apply_ready_rows", &apply_ready_rows_cuda);
  m.impl("record_row_norms", &record_row_norms_cuda);
  m.impl("validate_reads", &validate_reads_cuda);
}

}  // namespace odin
