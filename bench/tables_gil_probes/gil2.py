# The step tables' maker beside a main thread that holds the GIL for a share d of every 20 ms
# (Python work, then a GIL-free wait: a GPU host's training thread, busy launching, then
# waiting on the device). Main thread on core 0, the maker (and its cutter) on core 1.
import os, sys, threading, time, numpy as np, torch
from odin_ns.bench import control_plane as cp
from odin_ns.runtime.step_tables import step_rows, groups_ahead
layout = sys.argv[1]; R = int(sys.argv[2]); steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
torch.set_num_threads(1)
F = cp.city_footprints(1_000_000, 0.05, R * 8, 0)
ranks = {d: cp.RANKS_UNDER_TEST[layout](F, R, steps + 5, "quality-first", 0, "meta") for d in (0,)}
rank = ranks[0]
os.sched_setaffinity(0, {0})
def run(d, period=0.020):
    made = step_rows(rank.plan, rank.layout, R, steps, aside=not rank.layout.replicated,
                     group_writers=groups_ahead(rank.layout, R, True))
    out = {}
    def maker():
        os.sched_setaffinity(0, {1})
        tic = time.perf_counter(); n = 0
        for st in made: n += 1
        out['s'] = (time.perf_counter() - tic) / n
    th = threading.Thread(target=maker); th.start()
    while th.is_alive():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < d * period:
            x = sum(range(50))
        rest = period - (time.perf_counter() - t0)
        if rest > 0: time.sleep(rest)
    return out['s']
res = {}
for rep in range(2):
    for d in (0.0, 0.25, 0.5, 0.75, 1.0):
        res.setdefault(d, []).append(1e3 * run(d))
for d, v in res.items():
    print(f"{layout} R={R} main busy {d:.2f} of 20 ms: tables {np.median(v):.1f} ms/step ({', '.join(f'{x:.1f}' for x in v)})")
