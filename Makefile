# Two commands that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
DEMO_DIR ?= demo_data/street
DEMO_OUT ?= outputs/demo
DEMO_STEPS ?= 300
DEMO_RANKS ?= 2
SRC := odin_ns method_configs viewer_ext tests
# Ranks and tests share few cores: OpenMP workers must not spin while waiting.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: venv test lint demo bench bench-phase-ab bench-scale-inputs bench-scale clean

# Large wheels (open3d is 400 MB) can lose their connection part-way: pip resumes a
# broken download (one install here needed 21 resumes for its last 30 MB). A registry
# outage outlasts resumes (one CI run saw 200 fail at the same byte of open3d), so a failed
# install is tried again, six times in all, waiting 15 s, 30 s, 60 s, then 120 s between
# tries; wheels that finished downloading stay in pip's cache and are not fetched again.
PIP := $(PY) -m pip install -q --retries 10 --timeout 60 --resume-retries 200
pip_install = delay=15; for attempt in 1 2 3 4 5 6; do $(PIP) $(1) && break; \
	[ $$attempt = 6 ] && exit 1; echo "pip install failed (attempt $$attempt of 6), retrying in $$delay s"; \
	sleep $$delay; delay=$$((delay < 120 ? delay * 2 : 120)); done;

# The installed .venv takes about 8 GB (torch's CUDA libraries most of it); pip needs room
# for the wheels besides. One CI run filled its disk part-way through the install and spent
# its retries on it: before a new .venv, check the room first and say so.
VENV_MIN_FREE_GB ?= 10

$(VENV)/.installed: pyproject.toml
	@free_kb=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	[ -d $(VENV) ] || [ "$$free_kb" -ge $$(( $(VENV_MIN_FREE_GB) * 1024 * 1024 )) ] || { \
	echo "make venv needs about $(VENV_MIN_FREE_GB) GB free on the disk that holds $(CURDIR);" \
	"it has $$(( free_kb / 1024 / 1024 )) GB. Free some space (or set VENV_MIN_FREE_GB) and run it again." >&2; exit 1; }
	# open3d (nerfstudio's point-cloud loader) needs libusb; Debian machines may lack it.
	@ldconfig -p | grep -q libusb-1.0 || { apt-get update -qq && apt-get install -y -qq libusb-1.0-0; }
	# tests/test_viewer.py opens the viser panels in Debian's headless chromium.
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --retries 10 --upgrade "pip>=25.1"
	# torch first, pinned: the CUDA 13.0 build that pip serves from local disk here.
	$(call pip_install,torch==2.14.1 torchvision==0.29.1)
	$(call pip_install,-e ".[dev]")
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)

test: lint
	$(PY) -m odin_ns.cuda build
	$(PY) -m pytest -q --durations=15

demo: venv
	$(PY) -m odin_ns.data.synthetic --out $(DEMO_DIR) --layout street
	rm -rf $(DEMO_OUT)
	$(BIN)/odin-ns-train --nproc-per-node $(DEMO_RANKS) odin-splatfacto \
		--data $(DEMO_DIR) --output-dir $(DEMO_OUT) --experiment-name street --timestamp demo \
		--max-num-iterations $(DEMO_STEPS) --vis tensorboard --steps-per-eval-all-images 0 \
		--pipeline.model.num-downscales 0 --pipeline.model.warmup-length 100 \
		--pipeline.model.refine-every 50 --pipeline.model.sh-degree-interval 100 \
		--pipeline.sync.mode quality-first
	$(BIN)/ns-eval --load-config $(DEMO_OUT)/street/odin-splatfacto/demo/config.yml \
		--output-path $(DEMO_OUT)/eval.json
	$(PY) -m odin_ns.report_eval $(DEMO_OUT)/eval.json

# Phase-start cost of two code versions, interleaved (ABBA), e.g. before and after a change:
#   git worktree add --detach ../before COMMIT
#   ln -s ../method_configs ../before/odin_ns/method_configs  # its own copies, as the
#   ln -s ../viewer_ext ../before/odin_ns/viewer_ext          # install maps this clone's
#   make bench-phase-ab A=../before B=.
bench-phase-ab: venv
	$(PY) -m odin_ns.data.synthetic --out $(DEMO_DIR) --layout street
	$(PY) -m odin_ns.bench.phase_ab --a $(A) --b $(B) --data $(abspath $(DEMO_DIR)) \
		--rounds 3 --out bench/phase_start_ab_street.json

# the two admission rules by name (the runs below reported the default, the overlap rule, as tf)
IMPACT_MODES := barrier,quality-first,throughput-first-overlap,throughput-first-impact
TAU_RUN := --ranks 2 --steps 200 --modes barrier,quality-first,throughput-first-impact \
	--repeats 3 --control --paired-seeds

bench: venv
	$(PY) -m odin_ns.bench.raster --out bench/raster.json
	$(PY) -m odin_ns.bench.schedule --views 2000 --primitives 200000 --ranks 8 --out bench/schedule.json
	$(PY) -m odin_ns.bench.ops --out bench/ops.json
	$(PY) -m odin_ns.bench.control_plane --rows 1000000 --ranks 8,64 --out bench/control_plane.json
	$(PY) -m odin_ns.bench.tables_gil --switch-ms 5,1 --out bench/tables_gil.json
	$(PY) -m odin_ns.bench.viewer_overhead --out bench/viewer_overhead.json
	$(PY) -m odin_ns.data.synthetic --out $(DEMO_DIR) --layout street
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --control \
		--seed-control 2 --modes ddp,barrier,quality-first,throughput-first --out bench/sync_street.json
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 --ranks 2 --steps 300 \
		--repeats 5 --control --seed-control 2 --modes ddp,barrier,quality-first,throughput-first \
		--out bench/sync_fox.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.methods --data ../shared/data/fox --downscale-factor 8 --steps 300 \
		--methods odin-splatfacto,odin-splatfacto-mcmc --out bench/methods_fox.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.methods --data ../shared/data/lego_subset --dataparser blender-data \
		--steps 300 --methods odin-splatfacto,odin-splatfacto-mcmc --out bench/methods_lego.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.25 --pipeline.model.background-color white \
		--pipeline.model.num-random 10000 --pipeline.model.random-scale 3
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 3 --steps 300 --repeats 1 \
		--modes ddp,barrier,quality-first --work-dir outputs/bench_sync/street3 \
		--out bench/sync_street_3ranks.json
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.25,0.5 \
		--out bench/stragglers_street.json
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.25,0.5 --out bench/stragglers_fox.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 3 --shares 0,0.5 --repeats 3 \
		--modes $(IMPACT_MODES) --out bench/stragglers_street_3ranks.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 3 --steps 300 --repeats 5 --paired-seeds \
		--modes $(IMPACT_MODES) --out bench/sync_street_3ranks_paired_seeds_one_engine.json
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 5 \
		--psnr --seed-control 2 --modes $(IMPACT_MODES) --out bench/stragglers_street_one_engine.json
	$(PY) -m odin_ns.data.synthetic --out demo_data/drive --layout drive
	$(PY) -m odin_ns.bench.stragglers --data demo_data/drive --ranks 2 --shares 0,0.5 --repeats 3 \
		--psnr --seed-control 2 --modes $(IMPACT_MODES) \
		--out bench/stragglers_drive_tau04_one_engine.json -- --pipeline.sync.tau 0.4
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --psnr --seed-control 2 --modes $(IMPACT_MODES) \
		--out bench/stragglers_fox_one_engine.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --psnr --seed-control 2 \
		--modes barrier,quality-first,throughput-first-impact \
		--out bench/stragglers_fox_tau04_one_engine.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 0.4
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 3 \
		--modes barrier,quality-first --out bench/stragglers_street_no_phase_starts.json \
		-- --pipeline.model.warmup-length 1000000
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 3 \
		--modes barrier,quality-first --out bench/stragglers_street_replay_no_phase_starts.json \
		-- --pipeline.model.warmup-length 1000000
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 3 \
		--modes barrier,quality-first --out bench/stragglers_street_replay.json
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --modes barrier,quality-first --out bench/stragglers_fox_replay.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.data.synthetic --out demo_data/drive --layout drive
	$(PY) -m odin_ns.bench.stragglers --data demo_data/drive --ranks 2 --shares 0,0.5 --repeats 3 \
		--psnr --seed-control 2 --modes $(IMPACT_MODES) --out bench/stragglers_impact_drive.json
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --psnr --seed-control 2 --modes $(IMPACT_MODES) \
		--out bench/stragglers_impact_fox.json -- --pipeline.datamanager.camera-res-scale-factor 0.5
	# the impact rule at larger tau under half-step delays, a seed per round (issue 30)
	$(PY) -m odin_ns.bench.sync --data demo_data/drive $(TAU_RUN) --jitter-ms 68 \
		--out bench/sync_drive_tau04_jitter68.json -- --pipeline.sync.tau 0.4
	$(PY) -m odin_ns.bench.sync --data demo_data/drive $(TAU_RUN) --jitter-ms 68 \
		--out bench/sync_drive_tau06_jitter68.json -- --pipeline.sync.tau 0.6
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 $(TAU_RUN) \
		--jitter-ms 48 --out bench/sync_fox_tau04_jitter48.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 0.4
	# the plan's step order: low-conflict (default) vs shuffled, half-step delays and PSNR
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 200 --repeats 4 --control \
		--modes barrier,quality-first,quality-first-shuffled --jitter-ms 24 --no-eval \
		--out bench/sync_step_order_street_jitter24.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 200 --repeats 4 --control \
		--modes barrier,quality-first,quality-first-shuffled --jitter-ms 24 --no-eval \
		--out bench/sync_step_order_street_sharded_jitter24.json -- --pipeline.parallel sharded
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 3 --steps 300 --repeats 4 --control \
		--modes barrier,quality-first,quality-first-shuffled --jitter-ms 107 --no-eval \
		--work-dir outputs/bench_sync/street3_order --out bench/sync_step_order_street_3ranks_jitter107.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 200 --repeats 5 --control \
		--modes barrier,quality-first,throughput-first-overlap,throughput-first-impact --jitter-ms 24 \
		--no-eval --work-dir outputs/bench_sync/street_tf_order --out bench/sync_tf_ordered_street_jitter24.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 6 --paired-seeds \
		--modes barrier,throughput-first-overlap,throughput-first-impact \
		--work-dir outputs/bench_sync/street_tf_order_psnr --out bench/sync_tf_ordered_street_paired_seeds.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 6 --paired-seeds \
		--modes barrier,quality-first-shuffled --out bench/sync_step_order_street_paired_seeds.json
	# issue 30 with the critical-path wait (how much later a run ends than without waits); the
	# committed paired-seed run was made at f440e1f, when the default was the impact rule (its tf)
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 3 \
		--psnr --modes barrier,quality-first,throughput-first-overlap,throughput-first-impact \
		--out bench/stragglers_street_critical_path.json
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --psnr \
		--modes barrier,quality-first,throughput-first-overlap,throughput-first-impact \
		--out bench/stragglers_fox_critical_path.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,quality-first,throughput-first-impact,throughput-first-overlap \
		--out bench/sync_street_paired_seeds_impact_default.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,throughput-first-impact --out bench/sync_street_paired_seeds_impact_k1.json \
		-- --pipeline.sync.staleness-window 1
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,throughput-first-impact --out bench/sync_street_paired_seeds_impact_drop.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,throughput-first --out bench/sync_street_paired_seeds_overlap_drop.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,throughput-first-impact \
		--out bench/sync_street_paired_seeds_impact_drop_tau01.json -- --pipeline.sync.tau 0.1
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 200 --repeats 3 --control \
		--no-eval --jitter-ms 19 --modes barrier,quality-first,throughput-first,throughput-first-impact \
		--out bench/sync_street_jitter19_impact_tau01.json -- --pipeline.sync.tau 0.1
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 3 --shares 0,0.5 --repeats 3 \
		--modes barrier,quality-first,throughput-first,throughput-first-impact \
		--out bench/stragglers_street_3ranks_critical_path.json
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 5 \
		--psnr --seed-control 2 --modes barrier,quality-first,throughput-first,throughput-first-impact \
		--out bench/stragglers_street_head.json
	# stale gradients dropped (the default) or applied, the impact rule at tau 1.0 (issue 30); the
	# runs before the tfia mode passed the policy as an extra flag to tfi
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 $(TAU_RUN) \
		--jitter-ms 48 --out bench/sync_fox_tau10_jitter48.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 1.0
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 $(TAU_RUN) \
		--jitter-ms 48 --out bench/sync_fox_tau10_apply_jitter48.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 1.0 \
		--pipeline.sync.stale-gradients apply
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 --ranks 2 --steps 200 \
		--modes barrier,quality-first,throughput-first-impact-apply --repeats 5 --control \
		--paired-seeds --jitter-ms 48 --out bench/sync_fox_tau10_apply_jitter48_5rounds.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 1.0
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --psnr --modes barrier,quality-first,throughput-first-impact-apply \
		--out bench/stragglers_fox_tau10_apply.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 1.0
	$(PY) -m odin_ns.bench.stragglers --data demo_data/drive --ranks 2 --shares 0,0.5 --repeats 3 \
		--psnr --seed-control 2 --modes barrier,quality-first,throughput-first-impact-apply \
		--out bench/stragglers_drive_tau10_apply.json -- --pipeline.sync.tau 1.0
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) $(TAU_RUN) --jitter-ms 19 \
		--out bench/sync_street_tau10_apply_jitter19.json \
		-- --pipeline.sync.tau 1.0 --pipeline.sync.stale-gradients apply
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,throughput-first-impact,throughput-first-impact-apply \
		--out bench/sync_street_paired_tau10_drop_apply.json -- --pipeline.sync.tau 1.0
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,quality-first-shuffled,throughput-first-impact \
		--out bench/sync_street_paired_trajectory_control.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 10 --paired-seeds \
		--modes barrier,quality-first-shuffled,throughput-first-impact-apply \
		--out bench/sync_street_paired10_trajectory_tfia_tau10.json -- --pipeline.sync.tau 1.0
	# ten more paired seeds (52-61), throughput-first at its defaults (the same setting)
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 10 --paired-seeds \
		--seed 52 --modes barrier,throughput-first --out bench/sync_street_paired10_seeds52_default_tf.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 3 --steps 300 --repeats 5 --paired-seeds \
		--modes barrier,throughput-first-impact-apply \
		--out bench/sync_street_3ranks_paired_tfia_tau10.json -- --pipeline.sync.tau 1.0
	# the two runs that made the impact rule at tau 1.0 with stale gradients applied the
	# default; the runs above ran at the earlier defaults: there plain throughput-first is
	# the overlap rule at tau 0.2 with stale gradients dropped, and a mode naming no tau ran at 0.2
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 --ranks 2 --steps 200 \
		--modes barrier,quality-first,throughput-first-impact-apply --repeats 5 --control \
		--paired-seeds --out bench/sync_fox_tau10_apply_nodelay_5rounds.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5 --pipeline.sync.tau 1.0
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 200 --repeats 5 --control \
		--paired-seeds --jitter-ms 19 --modes barrier,quality-first,throughput-first-impact-apply \
		--out bench/sync_street_tau10_apply_jitter19_5seeds.json -- --pipeline.sync.tau 1.0
	# issue 30's straggler keys with throughput-first at its new defaults
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 2 --shares 0,0.5 --repeats 5 \
		--psnr --seed-control 2 --modes barrier,quality-first,throughput-first \
		--out bench/stragglers_street_default_tf.json
	$(PY) -m odin_ns.bench.stragglers --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
		--shares 0,0.5 --repeats 3 --psnr --seed-control 2 --modes barrier,quality-first,throughput-first \
		--out bench/stragglers_fox_default_tf.json -- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.stragglers --data $(DEMO_DIR) --ranks 3 --shares 0,0.5 --repeats 3 \
		--modes barrier,quality-first,throughput-first --out bench/stragglers_street_3ranks_default_tf.json
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 3 --steps 200 --repeats 3 --control \
		--paired-seeds --jitter-ms 43 --modes barrier,quality-first,throughput-first \
		--out bench/sync_street_3ranks_default_tf_jitter43_paired.json
	$(PY) -m odin_ns.bench.shard --ranks 2 3 4 --rounds 2 --out bench/shard.json
	$(PY) -m odin_ns.bench.shard --data ../shared/data/fox --downscale-factor 8 --ranks 2 3 4 \
		--rounds 1 --out bench/shard_fox.json
	$(PY) -m odin_ns.bench.shard --modes replicated sharded sharded-tf --ranks 2 3 --rounds 2 \
		--out bench/shard_tf_street.json
	$(PY) -m odin_ns.bench.shard_io --gaussians 2000000 --ranks 2 4 --rounds 2 --out bench/shard_io.json
	$(PY) -m odin_ns.bench.shard_scaling --out bench/shard_scaling.json
	for m in mcmc big; do \
		$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 1 \
			--modes ddp,barrier,quality-first,throughput-first --method odin-splatfacto-$$m \
			--out bench/sync_street_$$m.json && \
		$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 --ranks 2 \
			--steps 300 --repeats 1 --modes ddp,barrier,quality-first,throughput-first \
			--method odin-splatfacto-$$m --out bench/sync_fox_$$m.json \
			-- --pipeline.datamanager.camera-res-scale-factor 0.5 || exit 1; \
	done
	$(PY) -m odin_ns.bench.trace --run-json outputs/bench_sync/street/bench/odin-splatfacto/barrier-r0/odin_run.json \
		--out bench/trace_street.json

# The simulator's inputs, committed so that bench-scale rebuilds from the repository alone:
# traces of 2-rank runs (bench/traces), the gloo all-reduce the validation prices ddp with
# (bench/allreduce.json, measured in the same sitting as the traces), the gloo point-to-point
# link (bench/p2p_gloo.json); bench/control_plane.json comes from the bench target.
bench-scale-inputs: venv
	$(PY) -m odin_ns.data.synthetic --out $(DEMO_DIR) --layout street
	$(PY) -m odin_ns.bench.sync --data $(DEMO_DIR) --ranks 2 --steps 300 --repeats 3 --no-eval \
		--work-dir outputs/bench_sync/street_traces --out outputs/sync_street_traces.json
	$(PY) -m odin_ns.bench.trace_store --sync-json outputs/sync_street_traces.json --out-dir bench/traces/street
	$(PY) -m odin_ns.bench.sync --data ../shared/data/fox --downscale-factor 8 --ranks 2 --steps 300 \
		--repeats 3 --no-eval --work-dir outputs/bench_sync/fox_traces --out outputs/sync_fox_traces.json \
		-- --pipeline.datamanager.camera-res-scale-factor 0.5
	$(PY) -m odin_ns.bench.trace_store --sync-json outputs/sync_fox_traces.json --out-dir bench/traces/fox
	$(PY) -m odin_ns.bench.allreduce --out bench/allreduce.json
	$(PY) -m odin_ns.bench.p2p --out bench/p2p_gloo.json

bench-scale: venv
	$(PY) -m odin_ns.bench.scale --out bench/scale.json

clean:
	rm -rf $(VENV) outputs demo_data
