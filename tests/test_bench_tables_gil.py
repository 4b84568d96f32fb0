"""``bench.tables_gil``: a tiny run's report, its input checks, the consumer's errors (no
figure asserted)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from odin_ns.bench import tables_gil


def test_tiny_run_reports_every_variant_and_share(tmp_path):
    cores = os.sched_getaffinity(0)
    out = tmp_path / "tg.json"
    argv = ["--rows", "20000", "--ranks", "3", "--steps", "2", "--rounds", "2"]
    argv += ["--busy", "0,0.5", "--switch-ms", "5,1", "--period-ms", "4"]
    interval = sys.getswitchinterval()
    tables_gil.main([*argv, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["variants"] == ["r3_replicated", "r3_sharded"]
    assert result["pinned"] == (len(cores) >= 2)
    for key in result["variants"]:
        for name in (
            "busy0_switch5ms",
            "busy0.5_switch5ms",
            "busy0_switch1ms",
            "busy0.5_switch1ms",
        ):
            tables = f"tables_ms_per_step_{key}_{name}"
            assert 0 < result[f"{tables}_min"] <= result[tables] <= result[f"{tables}_max"]
        assert result[f"training_python_share_{key}_busy0.5_switch1ms"] > 0
        assert f"training_python_share_{key}_busy0_switch1ms" not in result  # (no Python)
    assert out.with_suffix(".png").stat().st_size > 0
    # the calling thread's cores and the interpreter's switch interval given back
    assert os.sched_getaffinity(0) == cores and sys.getswitchinterval() == interval


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--busy", "0,1.5"], "every share must lie in [0, 1]"),
        (["--switch-ms", "5,0"], "every interval must be above 0"),
        (["--busy", "0,half"], "take numbers separated by commas"),
        (["--layouts", "sharded,banded"], "unknown ['banded']"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_made(tmp_path, capsys, argv, message):
    out = tmp_path / "tg.json"
    with pytest.raises(SystemExit) as exit_:
        tables_gil.main([*argv, "--rows", "20000", "--ranks", "2", "--out", str(out)])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_a_consumer_that_fails_raises_on_the_calling_thread():
    """The tables' error reaches the caller (not a thread's traceback and a hang)."""

    class Broken:
        ahead = 0

        def __getitem__(self, t):
            raise IndexError(f"local step {t} outside the phase's 0 steps")

    consumer, out = tables_gil.start_consumer(Broken(), 0, 3, None)
    consumer.join(timeout=10)
    assert not consumer.is_alive()
    assert isinstance(out["error"], IndexError) and "s" not in out
