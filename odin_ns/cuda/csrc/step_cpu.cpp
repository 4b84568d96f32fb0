// Host kernel of every step: torch.ops.odin.step_union, the union of a step's footprints and
// each footprint's positions in it (the update log's control plane, odin_ns.runtime.
// update_log). Its specification is the torch twin update_log.step_union_reference
// (torch.unique + searchsorted), checked bitwise equal in tests/test_runtime.py.
//
// Two tables indexed by row id, kept per thread between calls and left cleared after each
// (only the entries a call touched are reset): a bit per row (which rows some footprint
// holds) and a counter per row (its writers, then its position in the union). Count every
// id, walk the set bits word by word (N / 64 words: the union comes out sorted without a
// pass over N rows), then read each footprint's positions back. Cost O(sum M + N / 64). The
// kernel before allocated, zeroed and scanned an [N] array every call: 3.5 ms per million
// rows of N per step here (16 ms at 3.24M Gaussians, 84 ms at 10M) whatever the footprints.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "host.h"

namespace odin {
namespace {

// Per-thread tables of step_union: all zero between calls.
struct UnionScratch {
  std::vector<uint64_t> rows_held;  // bit p: some footprint holds row p
  std::vector<int64_t> per_row;     // writers of row p, then its position in the union

  void fit(int64_t num_rows) {
    if (static_cast<int64_t>(per_row.size()) < num_rows) {
      per_row.resize(static_cast<size_t>(num_rows), 0);
      rows_held.resize(static_cast<size_t>((num_rows + 63) / 64), 0);
    }
  }
};

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> step_union_cpu(
    at::TensorList footprints, int64_t num_rows) {
  const char* op = "step_union";
  TORCH_CHECK_VALUE(num_rows >= 0, op, ": num_rows must be >= 0, got ", num_rows);
  std::vector<at::Tensor> inputs;
  inputs.reserve(footprints.size());
  for (const auto& fp : footprints) {
    TORCH_CHECK_VALUE(fp.device().is_cpu(), op, ": footprints must be host tensors");
    check_dtype(fp, at::kLong, op, "a footprint");
    TORCH_CHECK_VALUE(fp.dim() == 1, op, ": a footprint must have shape [M], got ", fp.sizes());
    check_ids(fp, num_rows, op, "a footprint");
    inputs.push_back(fp.contiguous());
  }
  thread_local UnionScratch scratch;
  scratch.fit(num_rows);
  int64_t* per_row = scratch.per_row.data();
  uint64_t* held = scratch.rows_held.data();
  int64_t unique = 0;
  for (const auto& c : inputs) {
    const int64_t* in = c.data_ptr<int64_t>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      const int64_t p = in[i];
      unique += per_row[p]++ == 0;
      held[p >> 6] |= uint64_t{1} << (p & 63);
    }
  }
  at::Tensor ids = at::empty({unique}, at::kLong);
  at::Tensor counts = at::empty({unique}, at::kLong);
  int64_t* ids_out = ids.data_ptr<int64_t>();
  int64_t* counts_out = counts.data_ptr<int64_t>();
  int64_t u = 0;
  const int64_t words = (num_rows + 63) / 64;
  for (int64_t w = 0; w < words && u < unique; ++w) {
    uint64_t bits = held[w];
    held[w] = 0;
    while (bits != 0) {
      const int64_t p = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      ids_out[u] = p;
      counts_out[u] = per_row[p];
      per_row[p] = u;  // from here on: the row's position
      ++u;
    }
  }
  std::vector<at::Tensor> positions;
  positions.reserve(inputs.size());
  for (const auto& c : inputs) {
    const int64_t* in = c.data_ptr<int64_t>();
    at::Tensor pos = at::empty({c.numel()}, at::kLong);
    int64_t* out = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < c.numel(); ++i) out[i] = per_row[in[i]];
    positions.push_back(pos);
  }
  for (int64_t i = 0; i < unique; ++i) per_row[ids_out[i]] = 0;  // cleared for the next call
  return {ids, counts, positions};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(odin, m) {
  m.def("step_union(Tensor[] footprints, int num_rows) -> (Tensor, Tensor, Tensor[])");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("step_union", &step_union_cpu); }

}  // namespace odin
