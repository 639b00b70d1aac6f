"""``spectral-jax sweep``: skip, resume, failures, and a table that ``table DIR/*`` reproduces.

Tiny generated ListOps, 4 steps per run, on the suite's 8 simulated CPU devices.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from spectral_jax.lra import data
from spectral_jax.lra.cli import train as cli
from spectral_jax.lra.train import sweep

ROOT = Path(__file__).resolve().parents[1]
LISTOPS = "lra/listops:quick"
_ITERATE = data.iterate_batches


def _overrides(data_dir: Path) -> list[str]:
    return [
        f"data.dir={data_dir}", "train.steps=4", "train.batch_size=8", "train.eval_every=2",
        "train.log_every=1", "train.schedule.warmup_steps=1", "model.num_layers=1",
        "model.embed_dim=16", "model.qkv_dim=16", "model.mlp_dim=32", "model.max_length=32",
        "data.options.max_length=32", "data.generate.num_train=48", "data.generate.num_val=16",
        "data.generate.num_test=12", "data.generate.min_length=8",
        "data.generate.max_length=32", "data.generate.max_depth=3",
    ]


def _interrupt_second_run(monkeypatch) -> None:
    """Ctrl-C in the second run, after its checkpoint at step 2 and before step 4."""
    original, opened = data.iterate_batches, []

    def iterate(split, batch_size, **kw):
        if not kw.get("shuffle"):
            yield from original(split, batch_size, **kw)
            return
        opened.append(1)
        for step, batch in enumerate(original(split, batch_size, **kw), start=1):
            if len(opened) == 2 and step == 4:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(data, "iterate_batches", iterate)


def _diverge(monkeypatch, name: str) -> None:
    """Injects a NaN: run ``name`` trains with a learning rate that overflows."""
    original = sweep._load

    def load(run):
        config = original(run)
        if run.name == name:
            config.train.optimizer.learning_rate = 1e30
            config.train.grad_clip_norm = None
            config.train.schedule.update(name="constant", warmup_steps=0)
        return config

    monkeypatch.setattr(sweep, "_load", load)


def test_sweep_skips_resumes_records_failures_and_tabulates(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    args = (LISTOPS, ("softmax", "linear"), [0, 1], str(out), _overrides(tmp_path / "listops"))
    _diverge(monkeypatch, "linear-seed1")
    _interrupt_second_run(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(*args, in_process=True, say=lambda _: None)
    partial = out / "softmax-seed1"
    assert (partial / "config.json").exists() and not (partial / "results.json").exists()
    assert sorted(p.name for p in (partial / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    monkeypatch.setattr(data, "iterate_batches", _ITERATE)

    lines: list[str] = []
    summary = sweep.run_sweep(*args, in_process=True, say=lines.append)
    status = {r["name"]: r["status"] for r in summary["runs"]}
    assert status == {"softmax-seed0": "skipped", "softmax-seed1": "finished",
                      "linear-seed0": "finished", "linear-seed1": "failed"}
    assert any("[2/4] softmax-seed1: resuming an interrupted run" in x for x in lines)
    assert any("runs left, about" in x for x in lines)
    metrics = [json.loads(x) for x in (partial / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["split"] == "train"] == [1, 2, 3, 4]

    table = json.loads((out / "table.json").read_text())
    assert [(g["attention"], g["n"], g["seeds"]) for g in table["groups"]] == [
        ("softmax", 2, [0, 1]), ("linear", 1, [0])]
    for group in table["groups"]:
        results = [json.loads((out / f"{group['attention']}-seed{s}/results.json").read_text())
                   for s in group["seeds"]]
        accuracies = [r["test_accuracy"] for r in results]
        assert group["test_accuracy"]["values"] == accuracies
        assert group["test_accuracy"]["mean"] == pytest.approx(statistics.fmean(accuracies))
        assert group["test_accuracy"]["std"] == pytest.approx(
            statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0)
        for r in results:  # the cost figures the loop records
            assert r["examples_per_s"] > 0 and r["train_step_peak_bytes"] > 0
            assert r["steps_per_s"] == pytest.approx(r["examples_per_s"] / 8)
        assert group["examples_per_s"]["values"] == [r["examples_per_s"] for r in results]
    [failed] = table["failed"]
    assert (failed["run"], failed["attention"], failed["seed"]) == (
        f"{out}/linear-seed1", "linear", 1)
    assert failed["reason"].startswith("diverged: training loss is NaN or inf at step")
    assert (out / "accuracy_vs_throughput.png").stat().st_size > 0
    md = (out / "table.md").read_text()
    assert f"| {out}/linear-seed1 | linear | 1 | diverged: training loss is NaN" in md

    # Another config over the same folders is refused, naming the first field that differs;
    # the data folder spelled relative is the same folder.
    monkeypatch.chdir(tmp_path)
    relative = [*_overrides(Path("listops")), "train.steps=5"]
    with pytest.raises(ValueError, match=r"softmax-seed0 \(train\.steps: 4 there, 5 now\)"):
        sweep.run_sweep(LISTOPS, ("softmax",), [0], str(out), relative, in_process=True,
                        say=lambda _: None)

    # `table DIR/*` (which also matches table.md, table.json, the plot) reproduces all of it.
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    again = tmp_path / "again.json"
    ns = parser.parse_args(["table", *sorted(glob.glob(f"{out}/*")), "--json", str(again)])
    buffer = StringIO()
    with redirect_stdout(buffer):
        assert ns.func(ns) == 0
    assert buffer.getvalue() == md
    assert json.loads(again.read_text()) == table


def test_sweep_arguments_are_checked():
    with pytest.raises(ValueError, match=r"'bogus' is not a registered method; known: softmax"):
        sweep.parse_methods("softmax,bogus")
    with pytest.raises(ValueError, match=r"sets 'attention=nystrom'; the sweep sets the method"):
        sweep.plan(f"{LISTOPS},attention=nystrom", ("softmax",), [0], "w")
    with pytest.raises(ValueError, match=r"--seeds \[0, 0\]: give one or more distinct ints"):
        sweep.plan(LISTOPS, ("softmax",), [0, 0], "w")


def test_failure_reasons():
    assert sweep.failure_reason(0, []) is None
    assert sweep.failure_reason(1, ["step 3", "error: training loss is NaN or inf at step 3"]) \
        == "diverged (exit status 1): error: training loss is NaN or inf at step 3"
    assert sweep.failure_reason(1, ["Traceback", "RuntimeError: RESOURCE_EXHAUSTED", ""]) \
        == "crashed (exit status 1): RuntimeError: RESOURCE_EXHAUSTED"
    assert sweep.failure_reason(-9, ["x"]).startswith("killed by signal 9 (SIGKILL")


def test_sweep_command_runs_each_method_in_its_own_process(tmp_path):
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "spectral_jax.lra.cli", "sweep", "--config", LISTOPS,
         "--attention", "softmax,linear", "--seeds", "0", "--workdir", str(out),
         *(f"--config.{o}" for o in _overrides(tmp_path / "listops")),
         "--config.model.attention_kwargs.feature_map=elu"],
        env=env, capture_output=True, text=True, timeout=300)
    # An override that one method does not take fails that method's runs only.
    assert done.returncode == 1, done.stderr[-2000:]
    assert "[2/2] linear-seed0: finished in" in done.stdout
    assert (out / "linear-seed0/train.log").read_text().startswith("$ ")
    failed = json.loads((out / "softmax-seed0/failed.json").read_text())
    assert failed["reason"].startswith("config error") and "feature_map" in failed["reason"]
    table = json.loads((out / "table.json").read_text())
    assert [g["attention"] for g in table["groups"]] == ["linear"]


def test_sweep_command_reports_bad_input_in_one_line(tmp_path, capsys):
    from spectral_jax.lra import cli as entry_point

    assert entry_point.main(["sweep", "--config", LISTOPS, "--attention", "nosuch",
                             "--workdir", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectral-jax sweep: error: --attention: 'nosuch' is not a registered "
                          "method; known: ") and len(err.splitlines()) == 1
    assert not (tmp_path / "sweep").exists()
