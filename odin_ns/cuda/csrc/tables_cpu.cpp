// Host kernels of a sharded phase's step tables (odin_ns.runtime.sharded.step_rows): from
// a step's record (step_record: the union ids [U] of every rank's reads, each rank's
// positions in it, each row's previous write) and the phase's ownership map, rank `rank`'s
// part of the step:
//
// - owner_rows: what it does as an owner: the union rows it owns (its update log's rows of
//   the step, local ids), their previous writes, each writer's positions among them; per
//   reader, the rows it alone owns that the reader reads and that were written earlier in
//   the phase (the push), with their previous writes;
// - reader_rows: what it does as a reader: its reads' global and local ids, the ones it
//   owns with their previous writes, per owner the gradient rows that go there, per owner
//   the rows its push brings.
//
// Their specifications are the torch twins sharded.owner_rows_reference and
// reader_rows_reference, checked equal in tests/test_sharded.py. Together they replace a
// dozen numpy passes per step and one more per peer (a gather of owners and local ids over
// the union, masks, a cumulative sum, per peer a compare and a gather): owner_rows passes
// once over the union and once over each footprint's positions, reader_rows twice over the
// rank's reads; every list is exactly its size (the tables stay for the phase). At 1M rows
// the numpy tables took 9 ms a step at R = 8.
//
// owner: [N] int32, a rank in [0, R) or -1 (every rank owns the row); local_of: [N] int32,
// the rank's local id of each row, -1 where it holds none.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "host.h"

namespace odin {
namespace {

constexpr int64_t kEveryRank = -1;  // an owner entry: every rank owns the row

struct OwnershipMap {
  const int32_t* owner;     // [N] a rank, or -1: every rank
  const int32_t* local_of;  // [N] the rank's local id, -1: none
  int64_t num_rows;
};

// The checks both kernels share, before any pass: host tensors of the right types and
// shapes, a rank in [0, R). (Values are checked as the passes read them: the outputs are
// new tensors, so a pass that raises has written nothing of the caller's.)
OwnershipMap check_map(const at::Tensor& ids, const at::Tensor& prev, const at::Tensor& owner,
                       const at::Tensor& local_of, int64_t rank, int64_t num_ranks,
                       const char* op) {
  for (const auto& [t, name, dtype] : {std::tuple<const at::Tensor&, const char*, at::ScalarType>{
                                           ids, "ids", at::kLong},
                                       {prev, "prev", at::kLong},
                                       {owner, "owner", at::kInt},
                                       {local_of, "local_of", at::kInt}}) {
    TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a host tensor");
    check_dtype(t, dtype, op, name);
    TORCH_CHECK_VALUE(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
  }
  const int64_t N = owner.size(0);
  check_shape_1d(local_of, N, op, "local_of");
  check_shape_1d(prev, ids.size(0), op, "prev");
  TORCH_CHECK_VALUE(num_ranks >= 1 && rank >= 0 && rank < num_ranks, op, ": rank ", rank,
                    " outside [0, ", num_ranks, ")");
  return {owner.data_ptr<int32_t>(), local_of.data_ptr<int32_t>(), N};
}

// The raises of the passes, out of their loops.
[[noreturn]] __attribute__((noinline)) void raise_out_of_range(const char* op, const char* what,
                                                               int64_t value, int64_t n) {
  TORCH_CHECK_VALUE(false, op, ": ", what, " out of range: ", value, " but must lie in [0, ", n,
                    ")");
  __builtin_unreachable();
}

[[noreturn]] __attribute__((noinline)) void raise_bad_owner(int64_t g, int64_t o,
                                                            int64_t num_ranks, const char* op) {
  TORCH_CHECK_VALUE(false, op, ": row ", g, " has owner ", o, ", not a rank in [0, ", num_ranks,
                    ") or -1 (every rank)");
  __builtin_unreachable();
}

// Global row g of the union (checked in [0, N)) and its owner entry (checked: a rank in
// [0, R) or -1).
inline int64_t owner_of(const OwnershipMap& map, int64_t g, int64_t num_ranks, const char* op) {
  if (static_cast<uint64_t>(g) >= static_cast<uint64_t>(map.num_rows)) {
    raise_out_of_range(op, "ids", g, map.num_rows);
  }
  const int64_t o = map.owner[g];
  if (o < kEveryRank || o >= num_ranks) raise_bad_owner(g, o, num_ranks, op);
  return o;
}

// A union position of a footprint, checked in [0, U).
inline int64_t position(const int64_t* at, int64_t i, int64_t U, const char* op) {
  const int64_t u = at[i];
  if (static_cast<uint64_t>(u) >= static_cast<uint64_t>(U)) {
    raise_out_of_range(op, "positions", u, U);
  }
  return u;
}

// A [M] int64 list of positions into the union (its values checked as they are read).
const int64_t* check_positions(const at::Tensor& p, const char* op) {
  TORCH_CHECK_VALUE(p.device().is_cpu(), op, ": positions must be host tensors");
  check_dtype(p, at::kLong, op, "positions");
  TORCH_CHECK_VALUE(p.dim() == 1 && p.is_contiguous(), op,
                    ": positions must be contiguous and 1-D, got shape ", p.sizes());
  return p.data_ptr<int64_t>();
}

inline at::Tensor longs(int64_t n) {
  return at::empty({n}, at::kLong);
}

// A [n] int64 tensor holding src[0:n].
at::Tensor copy_out(const int64_t* src, int64_t n) {
  at::Tensor t = longs(n);
  std::copy(src, src + n, t.data_ptr<int64_t>());
  return t;
}

// A thread's scratch arrays (grown, never shrunk), each reached through a raw pointer: a
// thread-local in a loop is a lookup per use. Lists are written into them without a branch,
// a slot advancing where the row belongs (a branch per row mispredicts), then copied out at
// their size.
struct Scratch {
  std::vector<int32_t> i32;
  std::vector<int64_t> i64[3];

  int32_t* int32s(int64_t n) { return grown(i32, n); }
  int64_t* int64s(int k, int64_t n) { return grown(i64[k], n); }

  template <typename T>
  static T* grown(std::vector<T>& v, int64_t n) {
    const auto size = static_cast<size_t>(std::max<int64_t>(n, 1));  // (never a null pointer)
    if (v.size() < size) v.resize(size);
    return v.data();
  }
};

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>,
           std::vector<at::Tensor>>
owner_rows_cpu(const at::Tensor& ids, at::TensorList positions, const at::Tensor& prev,
               const at::Tensor& owner, const at::Tensor& local_of, int64_t rank) {
  const char* op = "owner_rows";
  const auto R = static_cast<int64_t>(positions.size());
  const OwnershipMap map = check_map(ids, prev, owner, local_of, rank, R, op);
  const int64_t U = ids.size(0);
  std::vector<const int64_t*> at(R);
  for (int64_t q = 0; q < R; ++q) at[q] = check_positions(positions[q], op);
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* before = prev.data_ptr<int64_t>();
  // Pass over the union: per row a code, -1 where the rank does not own it, else twice its
  // position among the owned rows, plus one where it is pushed (the rank alone owns it and
  // it was written earlier in the phase); the owned rows' local ids and previous writes.
  // The footprints' passes then read one [U] int32 array, and the owned rows (a 1/R share).
  thread_local Scratch scratch;
  int32_t* code = scratch.int32s(U);
  int64_t* row = scratch.int64s(0, U);
  int64_t* row_prev = scratch.int64s(1, U);
  int64_t owned = 0;
  for (int64_t u = 0; u < U; ++u) {
    const int64_t g = id[u];
    const int64_t o = owner_of(map, g, R, op);
    const int64_t mine = (o == rank) | (o == kEveryRank);
    const int64_t pushed = (o == rank) & (before[u] >= 0);
    code[u] = static_cast<int32_t>((2 * owned + pushed + 1) * mine - 1);  // (no branch)
    row[owned] = map.local_of[g];
    row_prev[owned] = before[u];
    owned += mine;
  }
  at::Tensor rows = copy_out(row, owned);
  at::Tensor rows_prev = copy_out(row_prev, owned);
  const int64_t* owned_local = rows.data_ptr<int64_t>();
  const int64_t* owned_prev = rows_prev.data_ptr<int64_t>();
  const int64_t sink[1] = {0};  // what a row not owned reads (never kept)
  std::vector<at::Tensor> writer_positions, push_rows, push_prev;
  writer_positions.reserve(R);
  push_rows.reserve(R);
  push_prev.reserve(R);
  for (int64_t q = 0; q < R; ++q) {
    const int64_t* p = at[q];
    const int64_t m = positions[q].numel();
    int64_t* wp = scratch.int64s(0, m);
    int64_t* out = scratch.int64s(1, m);
    int64_t* out_prev = scratch.int64s(2, m);
    int64_t k = 0;
    int64_t j = 0;
    const int32_t to_peer = q != rank;  // (a rank pushes nothing to itself)
    for (int64_t i = 0; i < m; ++i) {
      const int32_t c = code[position(p, i, U, op)];
      const int32_t mine = c >= 0;
      const int64_t r = c >> 1;  // (-1 where not owned)
      wp[k] = r;
      k += mine;
      const int64_t* local_at = mine ? owned_local + r : sink;
      const int64_t* prev_at = mine ? owned_prev + r : sink;
      out[j] = *local_at;
      out_prev[j] = *prev_at;
      j += c & mine & to_peer;
    }
    writer_positions.push_back(copy_out(wp, k));
    push_rows.push_back(copy_out(out, j));
    push_prev.push_back(copy_out(out_prev, j));
  }
  return {rows, rows_prev, writer_positions, push_rows, push_prev};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>,
           std::vector<at::Tensor>, std::vector<at::Tensor>>
reader_rows_cpu(const at::Tensor& ids, const at::Tensor& reads, const at::Tensor& prev,
                const at::Tensor& owner, const at::Tensor& local_of, int64_t rank,
                int64_t num_ranks) {
  const char* op = "reader_rows";
  const OwnershipMap map = check_map(ids, prev, owner, local_of, rank, num_ranks, op);
  const int64_t U = ids.size(0);
  const int64_t* at = check_positions(reads, op);
  const int64_t M = reads.numel();
  const int64_t R = num_ranks;
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* before = prev.data_ptr<int64_t>();
  at::Tensor global = longs(M);
  at::Tensor local = longs(M);
  int64_t* g_out = global.data_ptr<int64_t>();
  int64_t* l_out = local.data_ptr<int64_t>();
  // pass over the reads: per read its owner and previous write; per owner the reads it
  // alone owns, and of those the ones written before
  thread_local Scratch scratch;
  int32_t* owners = scratch.int32s(M);
  int64_t* p_out = scratch.int64s(0, M);
  std::vector<int64_t> alone(R, 0), written(R, 0);
  int64_t own = 0;
  int64_t every = 0;
  for (int64_t i = 0; i < M; ++i) {
    const int64_t u = position(at, i, U, op);
    const int64_t g = id[u];
    const int64_t o = owner_of(map, g, R, op);
    const int64_t l = map.local_of[g];
    TORCH_CHECK_VALUE(l >= 0, op, ": rank ", rank, " reads row ", g,
                      ", which its local table does not hold");
    g_out[i] = g;
    l_out[i] = l;
    p_out[i] = before[u];
    owners[i] = static_cast<int32_t>(o);
    if (o == rank || o == kEveryRank) {
      ++own;
      every += o == kEveryRank;
    } else {
      ++alone[o];
      written[o] += before[u] >= 0;
    }
  }
  at::Tensor own_rows = longs(own);
  at::Tensor own_prev = longs(own);
  at::Tensor every_rows = longs(every);
  std::vector<at::Tensor> grad_rows, push_rows, push_prev;
  std::vector<int64_t*> grad_out(R), push_out(R), push_prev_out(R);
  for (int64_t o = 0; o < R; ++o) {
    // an owner of some of the reads gets those and the rows every rank owns; another none
    grad_rows.push_back(longs(alone[o] ? alone[o] + every : 0));
    push_rows.push_back(longs(written[o]));
    push_prev.push_back(longs(written[o]));
    grad_out[o] = grad_rows.back().data_ptr<int64_t>();
    push_out[o] = push_rows.back().data_ptr<int64_t>();
    push_prev_out[o] = push_prev.back().data_ptr<int64_t>();
  }
  int64_t* own_out = own_rows.data_ptr<int64_t>();
  int64_t* own_prev_out = own_prev.data_ptr<int64_t>();
  int64_t* every_out = every_rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < M; ++i) {
    const int64_t o = owners[i];
    const int64_t l = l_out[i];
    const int64_t p = p_out[i];
    if (o == rank || o == kEveryRank) {
      *own_out++ = l;
      *own_prev_out++ = p;
    }
    if (o == kEveryRank) {
      *every_out++ = l;
      for (int64_t q = 0; q < R; ++q) {
        if (alone[q]) *grad_out[q]++ = l;
      }
    } else if (o != rank) {
      *grad_out[o]++ = l;
      if (p >= 0) {
        *push_out[o]++ = l;
        *push_prev_out[o]++ = p;
      }
    }
  }
  return {global, local, own_rows, own_prev, every_rows, grad_rows, push_rows, push_prev};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(odin, m) {
  m.def(
      "owner_rows(Tensor ids, Tensor[] positions, Tensor prev, Tensor owner, Tensor local_of, "
      "int rank) -> (Tensor, Tensor, Tensor[], Tensor[], Tensor[])");
  m.def(
      "reader_rows(Tensor ids, Tensor reads, Tensor prev, Tensor owner, Tensor local_of, "
      "int rank, int num_ranks) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor[], Tensor[], "
      "Tensor[])");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("owner_rows", &owner_rows_cpu);
  m.impl("reader_rows", &reader_rows_cpu);
}

}  // namespace odin
