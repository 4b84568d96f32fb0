// Host kernels of every step, the update log's control plane (odin_ns.runtime.update_log):
//
// - step_record: the union of a step's footprints, each footprint's positions in it, and
//   every union row's planned previous write, read from and then advanced in last_write
//   (of the rows a caller holds, where it says which);
// - writer_groups: a step's rows grouped by their set of writers (made by a pending step
//   whose first look misses more than two writers), and each writer's groups;
// - add_arrivals: one more writer arrived for each of its groups; the rows of the groups
//   whose writers are now all in;
// - take_ready: of those rows, the ones whose previous planned write is applied: marked
//   applied, their versions set (or left to the update log), the step's ready mask and
//   the rows taken; mark_ready: all of them, where every previous write is applied (or, with
//   no list, every row not applied and not written by a missing writer);
// - first_lacking: the first of a read's rows, from a start, whose version is below the
//   step it needs (the engine's version tests: a step's owned reads, a push's rows);
//   lacking_rows: all of them (throughput-first's lagging reads);
// - write_versions: the versions of rows a look took without writing them, set when a read
//   asks (UpdateLog.settle_versions); any_unapplied: whether a pending step has one of a
//   read's rows not applied yet (UpdateLog.oldest_unapplied).
//
// Both take the step through which every update is applied (applied_through): a row whose
// step is at or below it has it, whatever the version vector says, so neither reads the
// vector for it (the update log writes the vector when asked, only for rows of steps beyond
// it, or take_ready writes it as it takes rows: write_step).
//
// Their specifications are the torch twins update_log.step_record_reference,
// writer_groups_reference, add_arrivals_reference, take_ready_reference,
// mark_ready_reference, first_lacking_reference, lacking_rows_reference,
// write_versions_reference and any_unapplied_reference, checked equal in
// tests/test_runtime.py and tests/test_sharded.py.
// Each replaces several torch operations per step (a unique and a searchsorted, a gather
// and a fill; a unique of writer sets and a sort; an index_add, a compare and a boolean-mask
// index; a gather, a compare, a fill and a scatter), one pass instead of one per operation
// and no temporaries. add_arrivals touches
// an arrival's groups and the rows it completes, take_ready those rows, never the whole
// step: an arrival costs the rows it completes (not the rows it carries: at R = 64 a step's
// publications hold 6x its union), and an apply what it applies, however often the engine
// looks.
//
// step_record marks the footprints' rows in a bit table and reads positions back as ranks
// (a popcount directory): O(sum M + N / 64), its tables small enough to stay in the cache.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "host.h"

namespace odin {
namespace {

// One footprint's ids (a host [M] int64 tensor, its type checked): strictly increasing, in
// [0, num_rows) (the twin's searchsorted needs sorted ids; checked before anything is
// written).
void check_footprint_ids(const at::Tensor& fp, int64_t num_rows, const char* op) {
  const int64_t m = fp.numel();
  if (m == 0) return;
  const int64_t* in = fp.data_ptr<int64_t>();
  TORCH_CHECK_VALUE(in[0] >= 0 && in[m - 1] < num_rows, op,
                    ": a footprint out of range: values span [", in[0], ", ", in[m - 1],
                    "] but must lie in [0, ", num_rows, ")");
  for (int64_t i = 1; i < m; ++i) {
    TORCH_CHECK_VALUE(in[i - 1] < in[i], op, ": a footprint must be sorted and unique (",
                      in[i - 1], " before ", in[i], ")");
  }
}

// One footprint: [M] int64 on the host, its ids as check_footprint_ids asks.
void check_footprint(const at::Tensor& fp, int64_t num_rows, const char* op) {
  TORCH_CHECK_VALUE(fp.device().is_cpu(), op, ": footprints must be host tensors");
  check_dtype(fp, at::kLong, op, "a footprint");
  TORCH_CHECK_VALUE(fp.dim() == 1, op, ": a footprint must have shape [M], got ", fp.sizes());
  check_footprint_ids(fp, num_rows, op);
}

// A pass that meets a footprint out of order or out of range raises check_footprint_ids'
// error.
[[noreturn]] __attribute__((noinline)) void raise_footprint(const at::Tensor& fp,
                                                            int64_t num_rows, const char* op) {
  check_footprint_ids(fp.to(at::kLong), num_rows, op);
  TORCH_CHECK(false, op, ": a footprint failed a check that check_footprint_ids passed");
}

// A footprint's ids copied to out, checked as they are read (strictly increasing, in
// [0, num_rows)); with keep, only the kept ones, a slot advancing where one is kept (no
// branch). Returns how many were copied.
template <typename I>
int64_t copy_footprint(const at::Tensor& fp, const bool* keep, int64_t num_rows, int64_t* out,
                       const char* op) {
  const I* in = fp.data_ptr<I>();
  const int64_t m = fp.numel();
  int64_t k = 0;
  int64_t before = -1;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t p = in[i];
    if (p <= before || p >= num_rows) raise_footprint(fp, num_rows, op);
    out[k] = p;
    k += keep == nullptr ? 1 : keep[p];
    before = p;
  }
  return k;
}

// Per-thread tables of step_record, all zero between calls: a bit per row (some footprint
// holds it) and, per 64-row word, the union's rows before the word (a rank directory). At
// N = 1M rows they take 125 KB + 62 KB, so the random accesses stay in the cache; a table
// of one counter per row (8 MB) swept once per footprint cost 7 ms per step at R = 8 here.
struct RankScratch {
  std::vector<uint64_t> held;  // [ceil(N / 64)] bit p: row p is in the union
  std::vector<int32_t> rank;   // [ceil(N / 64)] union rows in the words before

  void fit(int64_t num_rows) {
    const auto words = static_cast<size_t>((num_rows + 63) / 64);
    if (held.size() < words) {
      held.resize(words, 0);
      rank.resize(words, 0);
    }
  }
};

// Bits set in a word: the POPCNT instruction where the CPU has it (every x86-64 CPU that
// runs CUDA 13 or PyTorch 2), else the compiler's portable routine. Every function that
// counts bits carries the target too: a function of another target cannot inline it (a call
// per row was 13% of step_record's time).
#if defined(__x86_64__)
#define ODIN_POPCNT __attribute__((target("popcnt")))
#else
#define ODIN_POPCNT
#endif
ODIN_POPCNT inline int64_t bits_set(uint64_t word) {
  return __builtin_popcountll(word);
}

// Position in the union of a row p it holds (held: its bits; rank: per word, the rows
// before it).
ODIN_POPCNT inline int64_t union_position(const uint64_t* held, const int32_t* rank, int64_t p) {
  const uint64_t below = (uint64_t{1} << (p & 63)) - 1;
  return rank[p >> 6] + bits_set(held[p >> 6] & below);
}

// Mark every row of the footprints, number the marked rows in order (the union, sorted),
// then each footprint's positions are ranks: O(sum M + N / 64), every input read in order.
//
// With held ([N] bool), a footprint's rows that held lacks are left out first: the union is
// of the held rows, each footprint's positions are its held rows', and last_write is read and
// advanced for held rows only (a sharded rank's tables need the rows it owns or reads, a
// small share of every rank's reads at large R: the mark and position passes skip the rest).
ODIN_POPCNT std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor> step_record_cpu(
    at::TensorList footprints, const at::Tensor& last_write, int64_t step,
    const std::optional<at::Tensor>& held_rows) {
  const char* op = "step_record";
  TORCH_CHECK_VALUE(last_write.device().is_cpu(), op, ": last_write must be a host tensor");
  check_dtype(last_write, at::kLong, op, "last_write");
  check_shape_1d(last_write, -1, op, "last_write");
  check_contiguous(last_write, op, "last_write");
  const int64_t num_rows = last_write.size(0);
  const bool* keep = nullptr;  // [N] whether a row is kept; null: every row
  if (held_rows.has_value()) {
    TORCH_CHECK_VALUE(held_rows->device().is_cpu(), op, ": held must be a host tensor");
    check_dtype(*held_rows, at::kBool, op, "held");
    check_shape_1d(*held_rows, num_rows, op, "held");
    TORCH_CHECK_VALUE(held_rows->is_contiguous(), op, ": held must be contiguous");
    keep = held_rows->data_ptr<bool>();
  }
  std::vector<at::Tensor> inputs;
  inputs.reserve(footprints.size());
  int64_t copied = 0;  // ids of the footprints copied below
  for (const auto& fp : footprints) {
    TORCH_CHECK_VALUE(fp.device().is_cpu(), op, ": footprints must be host tensors");
    TORCH_CHECK_VALUE(fp.scalar_type() == at::kLong || fp.scalar_type() == at::kInt, op,
                      ": a footprint must be torch.int64 or torch.int32, got ",
                      dtype_name(fp.scalar_type()));
    TORCH_CHECK_VALUE(fp.dim() == 1, op, ": a footprint must have shape [M], got ", fp.sizes());
    inputs.push_back(fp.contiguous());
    if (keep != nullptr || fp.scalar_type() != at::kLong) copied += fp.numel();
  }
  // each footprint's rows as the passes read them: an int64 footprint's own ids where every
  // row is kept, else its (kept) ids copied into the thread's scratch as int64 by one pass
  // that checks them too (the plan's footprints are int32, scipy's, and read without a copy
  // to int64 in numpy); nothing else is written before every footprint is checked
  thread_local std::vector<int64_t> kept_scratch;
  if (static_cast<int64_t>(kept_scratch.size()) < copied + 1) kept_scratch.resize(copied + 1);
  std::vector<std::pair<const int64_t*, int64_t>> rows;
  rows.reserve(inputs.size());
  int64_t* kept = kept_scratch.data();
  for (const auto& c : inputs) {
    if (keep == nullptr && c.scalar_type() == at::kLong) {
      check_footprint_ids(c, num_rows, op);  // (its type checked above)
      rows.emplace_back(c.data_ptr<int64_t>(), c.numel());
      continue;
    }
    const int64_t k = c.scalar_type() == at::kLong
                          ? copy_footprint<int64_t>(c, keep, num_rows, kept, op)
                          : copy_footprint<int32_t>(c, keep, num_rows, kept, op);
    rows.emplace_back(kept, k);
    kept += k;
  }
  thread_local RankScratch table;
  table.fit(num_rows);
  uint64_t* held = table.held.data();  // raw pointers: no thread-local lookup in the loops
  int32_t* rank = table.rank.data();
  for (const auto& [in, m] : rows) {
    for (int64_t i = 0; i < m; ++i) held[in[i] >> 6] |= uint64_t{1} << (in[i] & 63);
  }
  const int64_t words = (num_rows + 63) / 64;
  int64_t unique = 0;
  for (int64_t w = 0; w < words; ++w) {
    rank[w] = static_cast<int32_t>(unique);
    unique += bits_set(held[w]);
  }
  at::Tensor ids = at::empty({unique}, at::kLong);
  at::Tensor prev = at::empty({unique}, at::kLong);
  int64_t* ids_out = ids.data_ptr<int64_t>();
  int64_t* prev_out = prev.data_ptr<int64_t>();
  int64_t* last = last_write.data_ptr<int64_t>();
  int64_t u = 0;
  for (int64_t w = 0; w < words && u < unique; ++w) {
    for (uint64_t bits = held[w]; bits != 0; bits &= bits - 1) {
      const int64_t p = w * 64 + __builtin_ctzll(bits);
      ids_out[u] = p;
      prev_out[u] = last[p];
      last[p] = step;
      ++u;
    }
  }
  std::vector<at::Tensor> positions;
  positions.reserve(rows.size());
  for (const auto& [in, m] : rows) {
    at::Tensor pos = at::empty({m}, at::kLong);
    int64_t* out = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i) out[i] = union_position(held, rank, in[i]);
    positions.push_back(pos);
  }
  std::fill(held, held + words, 0);  // cleared for the next call (the rank is rewritten)
  return {ids, positions, prev};
}

// The shared checks of the apply kernels: [U] tensors of a pending step.
void check_step_rows(const at::Tensor& t, int64_t U, at::ScalarType dtype, const char* op,
                     const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a host tensor");
  check_dtype(t, dtype, op, name);
  check_shape_1d(t, U, op, name);
  check_contiguous(t, op, name);
}

// Whether every one of U ids lies in [0, N): one pass without a branch per id, checked
// before any version is written.
bool ids_within(const int64_t* id, int64_t U, int64_t N) {
  bool in_range = true;
  for (int64_t u = 0; u < U; ++u) in_range &= (id[u] >= 0) & (id[u] < N);
  return in_range;
}

// A pending step's [U] int64 ids and the [N] int64 version vector; returns U. (That the ids
// lie within the vector is the caller's to check as it reads them.)
int64_t check_ids_and_versions(const at::Tensor& ids, const at::Tensor& versions,
                               const char* op) {
  TORCH_CHECK_VALUE(ids.dim() == 1, op, ": ids must have shape [U], got ", ids.sizes());
  const int64_t U = ids.size(0);
  check_step_rows(ids, U, at::kLong, op, "ids");
  check_step_rows(versions, -1, at::kLong, op, "versions");
  return U;
}

// Rows with the same writers complete together, so a step's rows are grouped by their set
// of writers once (update_log.WriterCounts): an arrival then counts down its groups, not
// its rows. Groups are numbered in the order of their first row; a group's rows are
// listed in increasing order; each writer's groups in increasing order.
//
// The sets are nodes of a trie built writer by writer (a row's node after writer q is the
// child of its node before, by q), so any number of writers works. While writer q is read,
// only children by q are made, so they sit in an array indexed by node (reset per writer):
// a row's step is an array read, not a hash lookup (with std::unordered_map: 2.5-3 ms for
// the 400K positions of an R = 8 step at 1M rows, most of them a lookup).
[[noreturn]] __attribute__((noinline)) void raise_no_writer(int64_t row, const char* op) {
  TORCH_CHECK_VALUE(false, op, ": row ", row, " has no writer");
  __builtin_unreachable();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> writer_groups_cpu(
    at::TensorList positions, int64_t num_rows) {
  const char* op = "writer_groups";
  TORCH_CHECK_VALUE(num_rows >= 0, op, ": num_rows must be >= 0, got ", num_rows);
  const auto R = static_cast<int64_t>(positions.size());
  std::vector<at::Tensor> inputs;
  inputs.reserve(R);
  for (const auto& pos : positions) {
    inputs.push_back(pos.contiguous());
    check_footprint(inputs.back(), num_rows, op);  // sorted, unique, in [0, num_rows)
  }
  std::vector<int32_t> node_of(num_rows, 0);  // node 0: no writer yet
  std::vector<int32_t> parent{-1};
  std::vector<int32_t> writer{-1};  // the writer that leads from the parent to the node
  std::vector<int32_t> depth{0};
  std::vector<int32_t> child;  // [nodes before writer q] its child by q (-1: none yet)
  int32_t* node = node_of.data();  // raw pointers in the row loop: a vector's would be
  for (int64_t q = 0; q < R; ++q) {  // reloaded from memory at every row (push_back)
    const int64_t* in = inputs[q].data_ptr<int64_t>();
    const int64_t m = inputs[q].numel();
    child.assign(parent.size(), -1);  // (a child by q has no child by q: no resize below)
    int32_t* kid = child.data();
    for (int64_t i = 0; i < m; ++i) {
      const int32_t n = node[in[i]];
      int32_t to = kid[n];
      if (to < 0) {
        to = kid[n] = static_cast<int32_t>(parent.size());
        parent.push_back(n);
        writer.push_back(static_cast<int32_t>(q));
        depth.push_back(depth[n] + 1);
      }
      node[in[i]] = to;
    }
  }
  // Each row's group (node_of is overwritten with it), then the rows listed group by group.
  std::vector<int32_t> group_of(parent.size(), -1);
  std::vector<int32_t> node_of_group;
  std::vector<std::array<int64_t, 4>> size;  // four counts a group: (consecutive rows
  for (int64_t p = 0; p < num_rows; ++p) {   // mostly share their group) no increment waits
    const int32_t n = node[p];               // on the last one's store
    if (n == 0) {  // (a check with p in its message, in the loop, keeps p in memory)
      raise_no_writer(p, op);
    }
    int32_t g = group_of[n];
    if (g < 0) {
      g = group_of[n] = static_cast<int32_t>(node_of_group.size());
      node_of_group.push_back(n);
      size.push_back({0, 0, 0, 0});
    }
    node[p] = g;
    ++size[g][p & 3];
  }
  const auto G = static_cast<int64_t>(node_of_group.size());
  at::Tensor group_ptr = at::empty({G + 1}, at::kLong);
  at::Tensor group_rows = at::empty({num_rows}, at::kLong);
  at::Tensor group_need = at::empty({G}, at::kInt);
  int64_t* ptr = group_ptr.data_ptr<int64_t>();
  ptr[0] = 0;
  for (int64_t g = 0; g < G; ++g) {
    ptr[g + 1] = ptr[g] + size[g][0] + size[g][1] + size[g][2] + size[g][3];
  }
  std::vector<int64_t> fill(ptr, ptr + G);
  int64_t* fill_at = fill.data();
  int64_t* rows = group_rows.data_ptr<int64_t>();
  for (int64_t p = 0; p < num_rows; ++p) rows[fill_at[node[p]]++] = p;
  std::vector<std::vector<int64_t>> groups_of_writer(R);
  int32_t* need = group_need.data_ptr<int32_t>();
  for (int64_t g = 0; g < G; ++g) {
    need[g] = depth[node_of_group[g]];
    for (int32_t n = node_of_group[g]; n > 0; n = parent[n]) {
      groups_of_writer[writer[n]].push_back(g);
    }
  }
  at::Tensor writer_ptr = at::empty({R + 1}, at::kLong);
  int64_t* wptr = writer_ptr.data_ptr<int64_t>();
  wptr[0] = 0;
  for (int64_t q = 0; q < R; ++q) wptr[q + 1] = wptr[q] + groups_of_writer[q].size();
  at::Tensor writer_groups = at::empty({wptr[R]}, at::kLong);
  int64_t* wg = writer_groups.data_ptr<int64_t>();
  for (int64_t q = 0; q < R; ++q) {
    std::copy(groups_of_writer[q].begin(), groups_of_writer[q].end(), wg + wptr[q]);
  }
  return {group_ptr, group_rows, group_need, writer_ptr, writer_groups};
}

at::Tensor add_arrivals_cpu(const at::Tensor& need, const at::Tensor& groups,
                            const at::Tensor& group_ptr, const at::Tensor& group_rows) {
  const char* op = "add_arrivals";
  check_step_rows(need, -1, at::kInt, op, "need");
  const int64_t G = need.size(0);
  check_step_rows(group_ptr, G + 1, at::kLong, op, "group_ptr");
  check_step_rows(groups, -1, at::kLong, op, "groups");
  check_step_rows(group_rows, -1, at::kLong, op, "group_rows");
  check_ids(groups, G, op, "groups");
  int32_t* left = need.data_ptr<int32_t>();
  const int64_t* at = groups.data_ptr<int64_t>();
  const int64_t* ptr = group_ptr.data_ptr<int64_t>();
  const int64_t* rows = group_rows.data_ptr<int64_t>();
  const int64_t m = groups.size(0);
  TORCH_CHECK_VALUE(G == 0 || (ptr[0] == 0 && ptr[G] == group_rows.size(0)), op,
                    ": group_ptr must run from 0 to len(group_rows)");
  for (int64_t i = 0; i < m; ++i) {  // before anything is written
    TORCH_CHECK_VALUE(left[at[i]] > 0, op, ": group ", at[i], " has no writer left to arrive");
  }
  std::vector<int64_t> complete;
  int64_t k = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (--left[at[i]] == 0) {
      complete.push_back(at[i]);
      k += ptr[at[i] + 1] - ptr[at[i]];
    }
  }
  at::Tensor out = at::empty({k}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  for (const int64_t g : complete) o = std::copy(rows + ptr[g], rows + ptr[g + 1], o);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> take_ready_cpu(
    const at::Tensor& candidates, const at::Tensor& applied, const at::Tensor& ids,
    const at::Tensor& prev, int64_t offset, const at::Tensor& versions,
    int64_t applied_through, int64_t write_step) {
  const char* op = "take_ready";
  const int64_t U = check_ids_and_versions(ids, versions, op);
  check_step_rows(applied, U, at::kBool, op, "applied");
  check_step_rows(prev, U, at::kLong, op, "prev");
  check_step_rows(candidates, -1, at::kLong, op, "candidates");
  const int64_t K = candidates.size(0);
  const int64_t* cand = candidates.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t N = versions.size(0);
  at::Tensor ready = at::zeros({U}, at::kBool);
  // the marked rows in row order, then (over the same memory) the candidates held back
  at::Tensor rows_in_order = at::empty({K + 1}, at::kLong);
  bool* out = ready.data_ptr<bool>();
  bool* done = applied.data_ptr<bool>();
  // The candidates come as the arrivals completed them (one sorted run per arrival): marked
  // in the output first (U bytes, in the cache), then gathered in row order, so that the
  // rows' previous writes (and, for a write beyond applied_through, ids and versions) are
  // read in address order. The gather has no branch per row: the marks are scattered, and a
  // branch on each mispredicted so often that a look at 50K candidates cost half or more of
  // one at 230K (R = 8, replicated). (Visiting the candidates as they come, without the
  // gather, where every previous write is at or before applied_through: 1.6 ms instead of
  // 1.0 for 240K candidates in 30 runs of a 290K-row step.)
  for (int64_t i = 0; i < K; ++i) {  // checked as marked, before any input is written
    TORCH_CHECK_VALUE(cand[i] >= 0 && cand[i] < U, op, ": candidates out of range: ", cand[i],
                      " but must lie in [0, ", U, ")");
    TORCH_CHECK(!done[cand[i]], op, ": union row ", cand[i], " is already applied");
    out[cand[i]] = true;
  }
  int64_t* order = rows_in_order.data_ptr<int64_t>();
  int64_t m = 0;  // marked rows (K, less any repeated candidate)
  for (int64_t c = 0; c < U; ++c) {
    order[m] = c;  // kept when marked, else written over: at most K + 1 slots
    m += out[c];
  }
  const int64_t* before = prev.data_ptr<int64_t>();
  const int64_t through = applied_through - offset;  // as a local step
  int64_t* version = versions.data_ptr<int64_t>();
  const bool write = write_step >= 0;
  at::Tensor taken = at::empty({m}, at::kLong);  // the rows taken, in row order
  int64_t* take = taken.data_ptr<int64_t>();
  int64_t n = 0;
  int64_t b = 0;  // held back, written over order[0, b) as it is read (b <= j)
  for (int64_t j = 0; j < m; ++j) {
    const int64_t c = order[j];
    bool ok = before[c] <= through;  // (-1: no write in the phase, so always)
    if (!ok || write) {
      const int64_t p = id[c];
      // an invariant of the update log (union ids index versions), checked where read
      TORCH_CHECK(p >= 0 && p < N, op, ": union id ", p, " out of range [0, ", N, ")");
      ok = ok || version[p] >= before[c] + offset;
      if (ok && write) version[p] = write_step;
    }
    if (ok) {
      done[c] = true;
      take[n++] = c;
    } else {
      out[c] = false;
      order[b++] = c;
    }
  }
  return {ready, taken.narrow(0, 0, n), rows_in_order.narrow(0, 0, b)};
}

// The positions of the U rows marked (a nonzero byte), listed without a branch: a store per
// row, the count advanced by its mark. Marked and unmarked rows interleave where a step's
// writers are missing, and a branch per row mispredicted half of them (mark_ready: 0.19 ms
// for 45K rows, 13K of them ready, against 0.05 where all are). Returns the list, in the
// calling thread's buffer (kept between calls, 4 bytes a row of the largest step: a fresh
// one's pages fault each call), and its length.
std::pair<const int32_t*, int64_t> list_marked(const uint8_t* mark, int64_t U) {
  TORCH_CHECK(U <= std::numeric_limits<int32_t>::max(), "a step's union of ", U,
              " rows is beyond int32 positions");
  thread_local std::vector<int32_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < U + 1) buffer.resize(U + 1);
  int32_t* listed = buffer.data();
  int64_t n = 0;
  for (int64_t u = 0; u < U; ++u) {
    listed[n] = static_cast<int32_t>(u);
    n += (mark[u] != 0);  // (a bool tensor's byte may hold any nonzero value)
  }
  return {listed, n};
}

// versions[ids[listed[j]]] = step for the n listed rows (ids and versions read for them
// alone), every one of those ids checked to lie in [0, N) before any version is written.
void write_listed_versions(const int32_t* listed, int64_t n, const int64_t* id, int64_t* version,
                           int64_t N, int64_t step, const char* op) {
  bool in_range = true;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = id[listed[j]];
    in_range &= (p >= 0) & (p < N);
  }
  TORCH_CHECK_VALUE(in_range, op, ": ids out of range [0, ", N, ")");
  for (int64_t j = 0; j < n; ++j) version[id[listed[j]]] = step;
}

// Every candidate is ready (the caller knows every previous write of the step is applied;
// no candidates: every row not applied, less the rows of the blocked lists, the missing
// writers' rows): marked in the output, checked as marked (in range, not applied, not
// repeated); then the ready rows listed and counted, their versions set where write_step >=
// 0, and applied |= ready. Two byte writes a candidate into [U] tables that stay in the
// cache, no read of the rows' previous writes: 0.2-0.4 ms for 250K candidates of a 290K-row
// step (0.05 without candidates), where take_ready's look at each row costs 0.6-0.95.
std::tuple<at::Tensor, int64_t> mark_ready_cpu(const std::optional<at::Tensor>& candidates,
                                               at::TensorList blocked, const at::Tensor& applied,
                                               const at::Tensor& ids, const at::Tensor& versions,
                                               int64_t write_step) {
  const char* op = "mark_ready";
  const int64_t U = check_ids_and_versions(ids, versions, op);
  check_step_rows(applied, U, at::kBool, op, "applied");
  TORCH_CHECK_VALUE(!candidates.has_value() || blocked.empty(), op,
                    ": blocked rows go with no candidates (every row not applied)");
  for (const auto& rows : blocked) {
    check_step_rows(rows, -1, at::kLong, op, "blocked rows");
    check_ids(rows, U, op, "blocked rows");
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t* version = versions.data_ptr<int64_t>();
  const int64_t N = versions.size(0);
  at::Tensor ready = at::empty({U}, at::kBool);
  // as bytes: logical operations on bool would branch per row, and the marks are scattered
  auto* out = reinterpret_cast<uint8_t*>(ready.data_ptr<bool>());
  auto* done = reinterpret_cast<uint8_t*>(applied.data_ptr<bool>());
  if (candidates.has_value()) {
    check_step_rows(*candidates, -1, at::kLong, op, "candidates");
    const int64_t K = candidates->size(0);
    const int64_t* cand = candidates->data_ptr<int64_t>();
    std::fill(out, out + U, uint8_t{0});
    for (int64_t i = 0; i < K; ++i) {  // checked before applied is written
      const int64_t c = cand[i];
      TORCH_CHECK_VALUE(c >= 0 && c < U, op, ": candidates out of range: ", c,
                        " but must lie in [0, ", U, ")");
      TORCH_CHECK(!done[c], op, ": union row ", c, " is already applied");
      TORCH_CHECK(!out[c], op, ": union row ", c, " is a candidate twice");
      out[c] = 1;
    }
  } else {
    for (int64_t u = 0; u < U; ++u) out[u] = (done[u] == 0);
    for (const auto& rows : blocked) {
      const int64_t* row = rows.data_ptr<int64_t>();
      const int64_t m = rows.size(0);
      for (int64_t i = 0; i < m; ++i) out[row[i]] = 0;
    }
  }
  const auto [listed, count] = list_marked(out, U);
  if (write_step >= 0) write_listed_versions(listed, count, id, version, N, write_step, op);
  for (int64_t u = 0; u < U; ++u) done[u] |= out[u];
  return {ready, count};
}

// A version test's arguments (first_lacking, lacking_rows), checked: [O] int64 versions, [K]
// int64 rows and the steps they need, a start in [0, K]; and the test of one row.
struct VersionTestRows {
  int64_t K, N;
  const int64_t* version;
  const int64_t* row;
  const int64_t* step;

  // Whether row i lacks its step: a step at or below applied_through is applied, a later
  // one where the row's version says so (read only then).
  bool lacks(int64_t i, int64_t applied_through) const {
    return step[i] > applied_through && version[row[i]] < step[i];
  }
};

VersionTestRows check_version_test(const at::Tensor& versions, const at::Tensor& rows,
                                   const at::Tensor& need, int64_t start, const char* op) {
  check_step_rows(versions, -1, at::kLong, op, "versions");
  check_step_rows(rows, -1, at::kLong, op, "rows");
  const int64_t K = rows.size(0);
  check_step_rows(need, K, at::kLong, op, "need");
  TORCH_CHECK_VALUE(start >= 0 && start <= K, op, ": start ", start, " outside [0, ", K, "]");
  return {K, versions.size(0), versions.data_ptr<int64_t>(), rows.data_ptr<int64_t>(),
          need.data_ptr<int64_t>()};
}

// A version test reads on from where the last one stopped, one row at a time, and stops at
// the first row that lacks its step: no temporaries, and a test that fails early reads
// little (numpy's gather, compare and argmax over the rest cost 5 ns a row and read all of
// it: 0.5 ms a step at R = 8, sharded, 1M rows). A row whose step is at or below
// applied_through has it: its version is not read.
int64_t first_lacking_cpu(const at::Tensor& versions, const at::Tensor& rows,
                          const at::Tensor& need, int64_t start, int64_t applied_through) {
  const char* op = "first_lacking";
  const auto test = check_version_test(versions, rows, need, start, op);
  for (int64_t i = start; i < test.K; ++i) {
    const int64_t p = test.row[i];  // (checked as read: a test that stops early reads little)
    TORCH_CHECK_VALUE(p >= 0 && p < test.N, op, ": rows out of range: ", p,
                      " but must lie in [0, ", test.N, ")");
    if (test.lacks(i, applied_through)) return i;
  }
  return test.K;
}

// Every row of a version test, from a start, that lacks its step (first_lacking's test,
// read to the end): their positions, in order. Throughput-first asks it of a step's owned
// reads when it decides (numpy's gather, compares and mask over every row: 0.4-0.8 ms a step
// at R = 8, 1M rows); rows before start were seen current.
at::Tensor lacking_rows_cpu(const at::Tensor& versions, const at::Tensor& rows,
                            const at::Tensor& need, int64_t start, int64_t applied_through) {
  const char* op = "lacking_rows";
  const auto test = check_version_test(versions, rows, need, start, op);
  TORCH_CHECK_VALUE(ids_within(test.row + start, test.K - start, test.N), op,
                    ": rows out of range [0, ", test.N, ")");
  std::vector<int64_t> lacking;
  for (int64_t i = start; i < test.K; ++i) {
    if (test.lacks(i, applied_through)) lacking.push_back(i);
  }
  auto out = at::empty({static_cast<int64_t>(lacking.size())}, at::kLong);
  std::copy(lacking.begin(), lacking.end(), out.data_ptr<int64_t>());
  return out;
}

// The versions the update log left unwritten (a look that took rows without writing them:
// write_step -1), written when a read asks, as mark_ready writes them (the ready rows
// listed, then their versions). torch's versions.index_fill_(0, ids[ready], step) makes the
// ids list first (a boolean-mask index; with the fill 2.6 ms a step over 400K-row steps at
// R = 8 replicated, where throughput-first asks at every step); this reads the mask once
// (0.4 ms) and checks the ids it writes before writing any.
void write_versions_cpu(const at::Tensor& versions, const at::Tensor& ids,
                        const at::Tensor& ready, int64_t step) {
  const char* op = "write_versions";
  const int64_t U = check_ids_and_versions(ids, versions, op);
  check_step_rows(ready, U, at::kBool, op, "ready");
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t* version = versions.data_ptr<int64_t>();
  const int64_t N = versions.size(0);
  const auto* take = reinterpret_cast<const uint8_t*>(ready.data_ptr<bool>());
  const auto [listed, n] = list_marked(take, U);
  write_listed_versions(listed, n, id, version, N, step, op);
}

// Whether any of a read's lagging rows is a row of a pending step not applied yet: a binary
// search per row that stops at the first such row (the oldest pending step a throughput-
// first source may lack is usually found at its first row; torch's searchsorted, gather,
// compare and any read every row: 2 ms a step at R = 8 replicated).
bool any_unapplied_cpu(const at::Tensor& step_ids, const at::Tensor& applied,
                       const at::Tensor& ids) {
  const char* op = "any_unapplied";
  check_step_rows(step_ids, -1, at::kLong, op, "step_ids");
  const int64_t U = step_ids.size(0);
  check_step_rows(applied, U, at::kBool, op, "applied");
  check_step_rows(ids, -1, at::kLong, op, "ids");
  const int64_t* row = step_ids.data_ptr<int64_t>();
  const bool* done = applied.data_ptr<bool>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t K = ids.size(0);
  for (int64_t i = 0; i < K; ++i) {
    const int64_t* at = std::lower_bound(row, row + U, id[i]);
    if (at != row + U && *at == id[i] && !done[at - row]) return true;
  }
  return false;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(odin, m) {
  m.def(
      "step_record(Tensor[] footprints, Tensor(a!) last_write, int step, Tensor? held=None) -> "
      "(Tensor, Tensor[], Tensor)");
  m.def(
      "writer_groups(Tensor[] positions, int num_rows) -> (Tensor, Tensor, Tensor, Tensor, "
      "Tensor)");
  m.def(
      "add_arrivals(Tensor(a!) need, Tensor groups, Tensor group_ptr, Tensor group_rows) -> "
      "Tensor");
  m.def(
      "take_ready(Tensor candidates, Tensor(a!) applied, Tensor ids, Tensor prev, int offset, "
      "Tensor(b!) versions, int applied_through, int write_step) -> (Tensor, Tensor, Tensor)");
  m.def(
      "mark_ready(Tensor? candidates, Tensor[] blocked, Tensor(a!) applied, Tensor ids, "
      "Tensor(b!) versions, int write_step) -> (Tensor, int)");
  m.def(
      "first_lacking(Tensor versions, Tensor rows, Tensor need, int start, int applied_through) "
      "-> int");
  m.def(
      "lacking_rows(Tensor versions, Tensor rows, Tensor need, int start, int applied_through) "
      "-> Tensor");
  m.def("write_versions(Tensor(a!) versions, Tensor ids, Tensor ready, int step) -> ()");
  m.def("any_unapplied(Tensor step_ids, Tensor applied, Tensor ids) -> bool");
}

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("step_record", &step_record_cpu);
  m.impl("writer_groups", &writer_groups_cpu);
  m.impl("add_arrivals", &add_arrivals_cpu);
  m.impl("take_ready", &take_ready_cpu);
  m.impl("mark_ready", &mark_ready_cpu);
  m.impl("first_lacking", &first_lacking_cpu);
  m.impl("lacking_rows", &lacking_rows_cpu);
  m.impl("write_versions", &write_versions_cpu);
  m.impl("any_unapplied", &any_unapplied_cpu);
}

}  // namespace odin
