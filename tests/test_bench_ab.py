"""benchmarks/bench_ab.py: --tuning-db builds B, not A, with the database, and a missing file
is refused before anything is built."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_ab", ROOT / "benchmarks" / "bench_ab.py")
bench_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_ab)


def test_missing_tuning_db_is_refused(tmp_path, capsys):
    missing = tmp_path / "none.json"
    with pytest.raises(SystemExit) as exc:
        bench_ab.main(["--tuning-db", str(missing), "--models", "resnet50"])
    assert exc.value.code == 2
    assert f"--tuning-db {missing}: no such file" in capsys.readouterr().err


def test_build_passes_the_tuning_db(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_ab.accel_target, "build", lambda mod, **kwargs: calls.append(kwargs) or mod)
    assert bench_ab._build(lambda: "module", "accel", [], "NHWC", "db.json") == "module"
    assert bench_ab._build(lambda: "module", "accel", [], None) == "module"
    assert [c["tuning_db"] for c in calls] == ["db.json", None]
    assert [c["input_layout"] for c in calls] == ["NHWC", None]
