# A/B in one process: the sharded tables made with each push's `ready` worked out where the
# tables are made (A: what step_rows did before, int(prev.max()) per push, on the maker's
# thread) or not (B: the lazy property, read at a drain only), beside a training thread that
# holds the GIL `busy` of every 20 ms; the maker (and its cutter) pinned to core 1, the
# training thread to core 0. Interleaved: A B B A per busy share, rounds alternating.
import os, sys, threading, time, numpy as np, torch
from odin_ns.bench import control_plane as cp
from odin_ns.bench.tables_gil import hold_gil
from odin_ns.runtime.step_tables import step_rows
R = int(sys.argv[1]); steps = int(sys.argv[2]); rounds = int(sys.argv[3])
torch.set_num_threads(1)
F = cp.city_footprints(1_000_000, 0.05, R * 8, 0)
rank = cp.RANKS_UNDER_TEST["sharded"](F, R, steps + 5, "quality-first", 0, "meta")
plan, layout = rank.plan, rank.layout
os.sched_setaffinity(0, {0})
def run(eager, busy):
    made = step_rows(plan, layout, R, steps, aside=True)
    out = {}
    def maker():
        os.sched_setaffinity(0, {1})
        tic = time.perf_counter()
        for st in made:
            if eager:
                [p.ready for p in st.pushes_in + st.pushes_out]
        out["s"] = (time.perf_counter() - tic) / steps
    th = threading.Thread(target=maker); th.start()
    hold_gil(busy, 0.020, th); th.join()
    return 1e3 * out["s"]
res = {}
for i in range(rounds):
    for busy in (0.0, 0.5, 0.75):
        for eager in ((True, False, False, True) if i % 2 == 0 else (False, True, True, False)):
            res.setdefault((busy, eager), []).append(run(eager, busy))
for busy in (0.0, 0.5, 0.75):
    a, b = res[(busy, True)], res[(busy, False)]
    print(f"R={R} sharded busy {busy}: A (ready made) {np.median(a):.2f} ms [{min(a):.2f}-{max(a):.2f}]  "
          f"B (lazy) {np.median(b):.2f} [{min(b):.2f}-{max(b):.2f}]  B/A {np.median(b)/np.median(a):.3f}")
