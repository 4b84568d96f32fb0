"""View locality graph and balanced spatial partition (DESIGN 3.3).

The locality graph links each view to the k views whose footprints overlap it most, with
Jaccard weights ``|Fi & Fj| / |Fi | Fj|`` from one sparse product ``F @ F.T``. That product
costs ``sum_p deg(p)^2`` (deg = views that see primitive p), which explodes when many
views see the same primitives (50k views, 1M primitives). So above ``max_work`` the product
is taken over a sample of primitives kept with probability ``min(1, c / deg(p))``: rare
primitives (the ones that say where a view is) are kept, ubiquitous ones thinned, and the
work drops to about ``c * nnz``. The weights are then estimates; the plan only uses them to
group views, never for correctness (the dependency table is exact).

The partition is recursive geodesic bisection: in each part, take a pseudo-peripheral pair
(a, b) of views (double Dijkstra sweep, edge length ``-log J``), sort by ``d(a, v) - d(b, v)``
and cut at the target count. It needs no eigensolver, is deterministic, and yields compact
groups of equal size. Disconnected pieces (views that share nothing) are kept whole when
possible.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from odin_ns.cuda import ops

# Views up to which the overlaps are dense [V, V] counts (the compiled kernel; 32 MiB).
DENSE_OVERLAP_MAX_VIEWS = 2048


def _sample_columns(deg: np.ndarray, max_work: float, seed: int) -> np.ndarray | None:
    """Keep mask [N] with P(keep p) = min(1, c / deg_p) so that sum deg^2 ~ max_work."""
    work = float(np.dot(deg.astype(np.float64), deg))
    if work <= max_work:
        return None
    d = np.sort(deg[deg > 0]).astype(np.float64)
    # expected work(c) = sum_p min(deg_p^2, c * deg_p); increasing in c: bisect on c.
    lo, hi = 0.0, float(d[-1])
    for _ in range(60):
        c = 0.5 * (lo + hi)
        w = float(np.minimum(d * d, c * d).sum())
        lo, hi = (c, hi) if w < max_work else (lo, c)
    prob = np.minimum(1.0, lo / np.maximum(deg, 1))
    rng = np.random.default_rng([seed, 0x10CA1])
    return rng.random(deg.shape[0]) < prob


def view_overlaps_reference(F: sp.csr_matrix) -> sp.csr_matrix:
    """[V, V] float32 ``|F_a & F_b|`` (diagonal ``|F_a|``) of a [V, N] 0/1 CSR matrix (sorted
    unique rows), nonzeros only, sorted indices: the sparse product ``F @ F.T``."""
    F = sp.csr_matrix(F, dtype=np.float32)
    P = (F @ F.T).tocsr()
    P.sort_indices()
    return P


def view_overlaps(F: sp.csr_matrix) -> sp.csr_matrix:
    """``view_overlaps_reference``; up to ``DENSE_OVERLAP_MAX_VIEWS`` views by the compiled
    kernel (``torch.ops.odin.view_overlaps``: dense [V, V] counts from the primitives' view
    lists; 24 views x 117k primitives, 4 views each: 14 ms -> 4 ms) when the CPU library is
    built."""
    num_views, n = F.shape
    kernel = ops.host_op("view_overlaps") if num_views <= DENSE_OVERLAP_MAX_VIEWS else None
    if kernel is None:
        return view_overlaps_reference(F)
    counts = kernel(*ops.csr_tensors(F), int(n)).numpy()
    return sp.csr_matrix(counts.astype(np.float32))


def exact_overlaps(footprints: sp.csr_matrix, max_work: float = 3e7) -> sp.csr_matrix | None:
    """``view_overlaps`` of ``footprints`` ([V, N] bool CSR, canonical) when its work
    ``sum_p deg(p)^2`` is at most ``max_work`` (``locality_graph`` then samples nothing and
    can take them), else None."""
    deg = np.bincount(footprints.indices, minlength=footprints.shape[1])
    if float(np.dot(deg.astype(np.float64), deg)) > max_work:
        return None
    return view_overlaps(footprints)


def locality_graph(
    footprints: sp.csr_matrix,  # [V, N] bool
    k: int = 16,
    max_work: float = 3e7,
    seed: int = 0,
    overlaps: sp.csr_matrix | None = None,  # exact_overlaps(footprints, max_work), if not None
) -> sp.csr_matrix:
    """Symmetric [V, V] float32 graph of Jaccard weights, top-``k`` neighbours per view.

    Views that share no (sampled) primitive with anyone are isolated rows.
    """
    num_views = footprints.shape[0]
    if num_views == 0 or footprints.nnz == 0:
        return sp.csr_matrix((num_views, num_views), dtype=np.float32)
    if overlaps is None:
        F = sp.csr_matrix(footprints, dtype=np.float32, copy=True)
        F.data[:] = 1.0
        keep = _sample_columns(np.bincount(F.indices, minlength=F.shape[1]), max_work, seed)
        if keep is not None:
            F.data = keep[F.indices].astype(np.float32)
            F.eliminate_zeros()
        overlaps = view_overlaps(F)
    P = overlaps
    size = P.diagonal().astype(np.float32)  # |F_a| (of the sampled primitives)
    rows = np.repeat(np.arange(num_views), np.diff(P.indptr))
    cols, shared = P.indices, P.data
    off = rows != cols
    rows, cols, shared = rows[off], cols[off], shared[off]
    jac = shared / np.maximum(size[rows] + size[cols] - shared, 1.0)
    # Top-k per row: rows ascend already; order each row by decreasing weight (stable).
    order = np.argsort(rows + 0.5 * (1.0 - jac.astype(np.float64)), kind="stable")
    rows, cols, jac = rows[order], cols[order], jac[order]
    starts = np.searchsorted(rows, np.arange(num_views))
    sel = np.arange(rows.shape[0]) - starts[rows] < k
    counts = np.bincount(rows[sel], minlength=num_views)
    indptr = np.zeros(num_views + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    G = sp.csr_matrix((jac[sel], cols[sel], indptr), shape=(num_views, num_views))
    return G.maximum(G.T).tocsr().astype(np.float32)


def _bisect_coordinate(W: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """(component key, coordinate) per node of W for a balanced cut.

    Components are ordered by size (largest first); inside one, the coordinate is
    ``d(a, v) - d(b, v)`` for a pseudo-peripheral pair (a, b).
    """
    n = W.shape[0]
    L = W.copy().tocsr()
    L.data = -np.log(np.clip(L.data, 1e-6, 1.0)) + 1e-3
    ncomp, labels = csgraph.connected_components(L, directed=False)
    sizes = np.bincount(labels, minlength=ncomp)
    comp_rank = np.empty(ncomp, dtype=np.int64)
    comp_rank[np.lexsort((np.arange(ncomp), -sizes))] = np.arange(ncomp)
    key = comp_rank[labels]
    coord = np.zeros(n, dtype=np.float64)
    big = sizes[labels] > 1
    if not big.any():
        return key, coord
    _, first = np.unique(labels, return_index=True)
    seeds = first[sizes > 1]

    def farthest(dist: np.ndarray) -> np.ndarray:
        order = np.lexsort((np.arange(n), dist, labels))
        last = np.r_[labels[order][1:] != labels[order][:-1], True]
        far = order[last]  # one per component, in label order
        return far[sizes > 1]

    d0 = csgraph.dijkstra(L, directed=False, indices=seeds, min_only=True)
    a = farthest(np.where(big, d0, -1.0))
    da = csgraph.dijkstra(L, directed=False, indices=a, min_only=True)
    b = farthest(np.where(big, da, -1.0))
    db = csgraph.dijkstra(L, directed=False, indices=b, min_only=True)
    coord[big] = da[big] - db[big]
    return key, coord


def partition_views(
    graph: sp.csr_matrix,  # [V, V] symmetric weights in (0, 1]
    num_parts: int,
    nodes: np.ndarray | None = None,  # [M] subset of views to partition (default: all)
) -> list[np.ndarray]:
    """Split ``nodes`` into ``num_parts`` spatially coherent groups of equal size (+-1).

    Part sizes follow ``np.array_split`` (the first ``M % num_parts`` parts get one
    more). Each returned group is sorted by view id.
    """
    if nodes is None:
        nodes = np.arange(graph.shape[0])
    nodes = np.asarray(nodes, dtype=np.int64)
    sizes = [len(p) for p in np.array_split(np.arange(len(nodes)), num_parts)]
    out: list[np.ndarray] = []

    def rec(sub: np.ndarray, part_sizes: list[int]) -> None:
        if len(part_sizes) == 1:
            out.append(np.sort(sub))
            return
        half = len(part_sizes) // 2
        n_left = sum(part_sizes[:half])
        if 0 < n_left < len(sub):
            key, coord = _bisect_coordinate(graph[sub][:, sub])
            order = np.lexsort((sub, coord, key))
        else:
            order = np.arange(len(sub))
        rec(sub[order[:n_left]], part_sizes[:half])
        rec(sub[order[n_left:]], part_sizes[half:])

    rec(nodes, sizes)
    return out
