// Host kernel of every step: torch.ops.odin.step_union, the union of a step's footprints and
// each footprint's positions in it (the update log's control plane, odin_ns.runtime.
// update_log). Its specification is the torch twin update_log.step_union_reference
// (torch.unique + searchsorted), checked bitwise equal in tests/test_runtime.py.
//
// One pass over a dense [N] scratch array instead of a sort: count every id's writers, scan
// the ids in order to number the union, then read each footprint's positions back. Cost
// O(N + sum M) with small constants (the sort-based twin costs O(sum M log sum M) plus
// R binary searches per row).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "host.h"

namespace odin {
namespace {

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> step_union_cpu(
    at::TensorList footprints, int64_t num_rows) {
  const char* op = "step_union";
  TORCH_CHECK_VALUE(num_rows >= 0, op, ": num_rows must be >= 0, got ", num_rows);
  for (const auto& fp : footprints) {
    TORCH_CHECK_VALUE(fp.device().is_cpu(), op, ": footprints must be host tensors");
    check_dtype(fp, at::kLong, op, "a footprint");
    TORCH_CHECK_VALUE(fp.dim() == 1, op, ": a footprint must have shape [M], got ", fp.sizes());
    check_ids(fp, num_rows, op, "a footprint");
  }
  // writers[p]: how many footprints hold row p; then the row's position in the union + 1.
  std::vector<int64_t> writers(static_cast<size_t>(num_rows), 0);
  for (const auto& fp : footprints) {
    const at::Tensor c = fp.contiguous();
    const int64_t* ids = c.data_ptr<int64_t>();
    for (int64_t i = 0; i < c.numel(); ++i) writers[ids[i]] += 1;
  }
  int64_t unique = 0;
  for (int64_t p = 0; p < num_rows; ++p) unique += writers[p] > 0;
  at::Tensor ids = at::empty({unique}, at::kLong);
  at::Tensor counts = at::empty({unique}, at::kLong);
  int64_t* ids_out = ids.data_ptr<int64_t>();
  int64_t* counts_out = counts.data_ptr<int64_t>();
  int64_t u = 0;
  for (int64_t p = 0; p < num_rows; ++p) {
    if (writers[p] > 0) {
      ids_out[u] = p;
      counts_out[u] = writers[p];
      writers[p] = u;  // from here on: the row's position
      ++u;
    }
  }
  std::vector<at::Tensor> positions;
  positions.reserve(footprints.size());
  for (const auto& fp : footprints) {
    const at::Tensor c = fp.contiguous();
    const int64_t* in = c.data_ptr<int64_t>();
    at::Tensor pos = at::empty({c.numel()}, at::kLong);
    int64_t* out = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < c.numel(); ++i) out[i] = writers[in[i]];
    positions.push_back(pos);
  }
  return {ids, counts, positions};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(odin, m) {
  m.def("step_union(Tensor[] footprints, int num_rows) -> (Tensor, Tensor, Tensor[])");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("step_union", &step_union_cpu); }

}  // namespace odin
