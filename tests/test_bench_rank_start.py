"""bench.rank_start: its round orders, and bad input refused before any run."""

from __future__ import annotations

import pytest

from odin_ns.bench import rank_start


def test_rounds_alternate_which_method_goes_first():
    assert rank_start.round_orders(4) == [
        ("fork", "spawn"),
        ("spawn", "fork"),
        ("fork", "spawn"),
        ("spawn", "fork"),
    ]


def test_a_folder_without_a_scene_is_refused_before_any_run(tmp_path, capsys):
    out, work = tmp_path / "rank_start.json", tmp_path / "runs"
    with pytest.raises(SystemExit) as exc:
        rank_start.main(["--data", str(tmp_path), "--out", str(out), "--work-dir", str(work)])
    assert exc.value.code == 2
    assert "no transforms.json" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists() and not work.exists()
