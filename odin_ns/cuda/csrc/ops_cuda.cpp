// CUDA implementations of torch.ops.odin.* (schemas in ops_cpu.cpp): checks, allocation
// and scans here, kernels in kernels.cu.
//
// Same semantics as the CPU kernels, with one documented difference: unpack_accumulate adds
// with atomics, so rows whose id repeats are summed in an unspecified order (equal to the
// CPU result up to float rounding; exact when ids are unique).
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

at::Tensor pack_rows_cuda(const at::Tensor& ids_in, at::TensorList tensors) {
  const auto rows = check_pack_inputs(ids_in, tensors);
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
  int64_t col = 0;
  for (size_t first = 0; first < rows.size(); first += cuda::kMaxPackTensors) {
    cuda::PackBatch batch{};
    batch.col_begin = col;
    batch.count = static_cast<int>(
        std::min<size_t>(cuda::kMaxPackTensors, rows.size() - first));
    for (int k = 0; k < batch.count; ++k) {
      batch.src[k] = rows[first + k].data_ptr<float>();
      batch.cols[k] = rows[first + k].size(1);
      batch.width += batch.cols[k];
    }
    col += batch.width;
    if (batch.width > 0) {
      check_launch(cuda::pack_rows(ids.data_ptr<int64_t>(), M, D, batch,
                                   buffer.data_ptr<float>(), stream),
                   "pack_rows");
    }
  }
  return buffer;
}

void unpack_accumulate_cuda(const at::Tensor& buffer_in, const at::Tensor& ids_in,
                            const at::Tensor& accum, const at::Tensor& arrivals) {
  check_unpack_inputs(buffer_in, ids_in, accum, arrivals);
  const int64_t M = ids_in.size(0);
  if (M == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(accum.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto buffer = buffer_in.contiguous();
  const auto ids = ids_in.contiguous();
  check_launch(cuda::unpack_accumulate(buffer.data_ptr<float>(), ids.data_ptr<int64_t>(), M,
                                       accum.size(1), accum.data_ptr<float>(),
                                       arrivals.data_ptr<int32_t>(), stream),
               "unpack_accumulate");
}

at::Tensor ready_mask_cuda(const at::Tensor& arrivals_in, const at::Tensor& expected_in,
                           const at::Tensor& blocked_in) {
  check_ready_inputs(arrivals_in, expected_in, blocked_in);
  const c10::cuda::CUDAGuard guard(arrivals_in.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto arrivals = arrivals_in.contiguous();
  const auto expected = expected_in.contiguous();
  const auto blocked = blocked_in.contiguous();
  const int64_t N = arrivals.size(0);
  auto ready = at::empty({N}, arrivals.options().dtype(at::kBool));
  if (N > 0) {
    check_launch(cuda::ready_mask(arrivals.data_ptr<int32_t>(), expected.data_ptr<int32_t>(),
                                  blocked.data_ptr<bool>(), ready.data_ptr<bool>(), N, stream),
                 "ready_mask");
  }
  return ready;
}

void selective_adam_apply_cuda(const at::Tensor& param, const at::Tensor& grad_in,
                               const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                               const at::Tensor& mask_in, const at::Tensor& versions, double lr,
                               double beta1, double beta2, double eps, int64_t step,
                               int64_t new_version) {
  check_adam_inputs(param, grad_in, exp_avg, exp_avg_sq, mask_in, versions, beta1, beta2,
                    step);
  const c10::cuda::CUDAGuard guard(param.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto grad = grad_in.contiguous();
  const auto mask = mask_in.contiguous();
  const int64_t N = param.size(0);
  if (N == 0 || param.numel() == 0) {
    versions.masked_fill_(mask, new_version);
    return;
  }
  const int64_t cols = param.numel() / N;
  // Same multiply-add fusion as the CPU op on this host, so the two agree (up to the
  // square root, which is IEEE here and MKL on the CPU).
  const bool fma = torch_cpu_uses_fma();
  cudaError_t err;
  if (param.scalar_type() == at::kFloat) {
    err = cuda::selective_adam_apply(
        param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
        exp_avg_sq.data_ptr<float>(), mask.data_ptr<bool>(), versions.data_ptr<int64_t>(), N,
        cols, make_adam_scalars<float>(lr, beta1, beta2, eps, step), fma, new_version, stream);
  } else {
    err = cuda::selective_adam_apply(
        param.data_ptr<double>(), grad.data_ptr<double>(), exp_avg.data_ptr<double>(),
        exp_avg_sq.data_ptr<double>(), mask.data_ptr<bool>(), versions.data_ptr<int64_t>(), N,
        cols, make_adam_scalars<double>(lr, beta1, beta2, eps, step), fma, new_version,
        stream);
  }
  check_launch(err, "selective_adam_apply");
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
                                      versions.data_ptr<int64_t>(),
                                      required.data_ptr<int64_t>(), M,
                                      counts.data_ptr<int64_t>(), stream),
                 "validate_reads");
  }
  auto [offsets, total] = exclusive_offsets(counts, nullptr);
  auto out = at::empty({total}, long_opts);
  if (total > 0) {
    check_launch(cuda::validate_write(read_ids.data_ptr<int64_t>(),
                                      versions.data_ptr<int64_t>(),
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
  m.impl("unpack_accumulate", &unpack_accumulate_cuda);
  m.impl("ready_mask", &ready_mask_cuda);
  m.impl("selective_adam_apply", &selective_adam_apply_cuda);
  m.impl("validate_reads", &validate_reads_cuda);
}

}  // namespace odin
