"""Without matplotlib (the ``bench`` extra) every command still succeeds; only plots are skipped.

matplotlib is hidden with ``sys.modules["matplotlib"] = None``, which makes each
``import matplotlib`` raise ImportError as on an install without it.
"""

from __future__ import annotations

import doctest
import json
import sys

import pytest

from spectral_jax.lra import cli
from spectral_jax.lra import plotting as _plotting
from spectral_jax.lra.train import sweep

LISTOPS = "lra/listops:quick"

def _line(path) -> str:
    return (f"skipped the plot {path}: matplotlib is not installed "
            "(pip install 'spectral_jax[bench]')")


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def _write_run(folder, attention, seed, accuracy):
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "task": "listops", "attention": attention, "protocol": "quick", "seed": seed,
        "test_accuracy": accuracy, "final_test_accuracy": accuracy, "majority_baseline": 0.1,
        "steps": 10, "wall_time_s": 5.0, "examples_per_s": 100.0 + seed}))


def test_docstring_examples():
    result = doctest.testmod(_plotting, report=False)
    assert result.failed == 0 and result.attempted == 3


def test_load_matplotlib_names_the_extra_when_missing(no_matplotlib, capsys):
    assert _plotting.load_matplotlib("the plot a.png") is None
    assert capsys.readouterr().err == _line("a.png") + "\n"


def test_table_plot_is_skipped_and_the_rest_written(no_matplotlib, tmp_path, capsys):
    _write_run(tmp_path / "runs" / "softmax-seed0", "softmax", 0, 0.4)
    png, table_json = tmp_path / "a.png", tmp_path / "t.json"
    rc = cli.main(["table", str(tmp_path / "runs" / "softmax-seed0"), "--json",
                   str(table_json), "--plot", str(png)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert err == _line(png) + "\n"
    assert "| softmax (quick) | 40.00 | 40.00 |" in out
    assert json.loads(table_json.read_text())["groups"][0]["label"] == "softmax (quick)"
    assert not png.exists()


def test_sweep_ends_with_status_0_and_its_tables(no_matplotlib, tmp_path, capsys):
    # Both runs finished before (results.json, no config.json): the sweep skips them and
    # goes straight to the tables, the step that needs matplotlib for its plot.
    out = tmp_path / "sweep"
    for seed in (0, 1):
        _write_run(out / f"softmax-seed{seed}", "softmax", seed, 0.4 + seed / 10)
    rc = cli.main(["sweep", "--config", LISTOPS, "--attention", "softmax", "--seeds", "0", "1",
                   "--workdir", str(out), "--in-process"])
    stdout, err = capsys.readouterr()
    assert rc == 0
    assert err == _line(out / sweep.PLOT_PNG) + "\n"
    assert f"wrote {out / sweep.TABLE_MD}, {out / sweep.TABLE_JSON}\n" in stdout
    table_md = (out / sweep.TABLE_MD).read_text()
    assert "| softmax (quick) | 45.00 ± 7.07 (n=2) | 45.00 |" in table_md
    assert json.loads((out / sweep.TABLE_JSON).read_text())["groups"][0]["n"] == 2
    assert [r["status"] for r in json.loads((out / sweep.SWEEP_JSON).read_text())["runs"]] == [
        "skipped", "skipped"]
    assert not (out / sweep.PLOT_PNG).exists()


def test_bench_speed_and_error_write_their_json(no_matplotlib, tmp_path, capsys):
    speed = tmp_path / "speed"
    rc = cli.main(["bench", "speed", "--methods", "linear", "--lengths", "16", "--heads", "1",
                   "--head-dim", "4", "--modes", "fwd", "--compile-only", "--out", str(speed)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert err == _line(f"{speed}.png") + "\n"
    assert f"wrote {speed}.json\n" in out
    assert {r["method"] for r in json.loads((tmp_path / "speed.json").read_text())["records"]} == {
        "softmax", "linear"}
    assert not (tmp_path / "speed.png").exists()

    error = tmp_path / "error"
    rc = cli.main(["bench", "error", "--methods", "linear", "--regimes", "diffuse", "--seeds",
                   "0", "--lengths", "16", "--heads", "1", "--head-dim", "4", "--out", str(error)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert err == _line(f"{error}.png") + "\n"
    assert f"wrote {error}.json\n" in out
    assert json.loads((tmp_path / "error.json").read_text())["summary"][0]["method"] == "linear"
    assert not (tmp_path / "error.png").exists()
