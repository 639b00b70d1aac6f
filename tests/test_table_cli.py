"""``spectral-jax table``: sweep folders, labels that say what ran, the README's tables, the plot.

The committed benchmark runs (``benchmarks/*/runs``) are real inputs: each study README's
results table must come out of ``table DIR --format readme`` line for line.
"""

from __future__ import annotations

import copy
import doctest
import importlib.util
import json
from pathlib import Path

import pytest

from spectral_jax.attention import available_attentions
from spectral_jax.lra import cli
from spectral_jax.lra.train import table_labels, table_plot, table_readme
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.run import recorded_config
from spectral_jax.lra.train.table import group_runs, markdown_table

ROOT = Path(__file__).resolve().parents[1]


def _preset(method: str = "softmax") -> dict:
    return recorded_config(
        load_config(f"lra/listops:quick,attention={method}")).to_dict()


def _record(method="softmax", seed=0, accuracy=0.4, config=None, run=None, **extra):
    return {"run": run or f"runs/{method}-seed{seed}", "task": "listops", "attention": method,
            "protocol": "quick", "seed": seed, "test_accuracy": accuracy,
            "final_test_accuracy": accuracy, "majority_baseline": 0.1, "steps": 10,
            "wall_time_s": 5.0, "examples_per_s": 100.0, "train_step_peak_bytes": 2**26,
            "num_params": 1000, **({} if config is None else {"config": config}), **extra}


def _changed(config: dict, **fields) -> dict:
    config = copy.deepcopy(config)
    for dotted, value in fields.items():
        *parents, last = dotted.split("__")
        node = config
        for key in parents:
            node = node[key]
        node[last] = value
    return config


@pytest.mark.parametrize("module", [table_labels, table_readme, table_plot])
def test_docstring_examples(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, report=False)
    assert result.failed == 0 and result.attempted > 0


def test_label_is_the_protocol_only_for_the_preset_unchanged(monkeypatch):
    preset = _preset()
    run = lambda config: table_labels.run_label(_record(config=config))  # noqa: E731
    assert run(preset) == "softmax (quick)"
    # Where the data lies, the seed, fields the run predates and fields filled in from the
    # data at train time are no change.
    older = _changed(preset, data__dir="/elsewhere/listops", seed=3, model__num_classes=10)
    del older["train"]["grad_clip_norm"]
    assert run(older) == "softmax (quick)"
    assert run(_changed(preset, train__steps=300)) == "softmax (quick, steps=300)"
    assert run(_changed(preset, train__steps=300, model__pooling="cls")) == (
        "softmax (quick, pooling=cls, steps=300)")
    assert run(_changed(preset, model__max_length=64, data__options__max_length=64)) == (
        "softmax (quick, data.options.max_length=64, model.max_length=64)")
    assert run(_changed(preset, train__steps=300, model__pooling="cls", seed=1,
                        train__batch_size=8)) == "softmax (quick, custom: 3 fields)"
    assert table_labels.run_label(_record()) == "softmax (quick)"  # no config recorded
    monkeypatch.setattr(table_labels, "config_file", lambda task: None)
    assert run(preset) == "softmax (quick, preset not found)"


def test_groups_sharing_a_custom_label_name_what_differs():
    base = _changed(_preset("nystrom"), train__batch_size=8, model__pooling="cls")
    rows = [_record("nystrom", config=_changed(base, train__steps=s), run=f"r{s}", accuracy=a)
            for s, a in ((100, 0.3), (200, 0.5))]
    assert [g["label"] for g in group_runs(rows)] == [
        "nystrom (quick, custom: 3 fields) [train.steps=100]",
        "nystrom (quick, custom: 3 fields) [train.steps=200]"]


def test_table_accepts_a_sweep_folder(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed, accuracy in ((0, 0.3), (1, 0.5)):
        (sweep / f"softmax-seed{seed}").mkdir(parents=True)
        (sweep / f"softmax-seed{seed}" / "results.json").write_text(
            json.dumps(_record(seed=seed, accuracy=accuracy)))
    (sweep / "linear-seed0").mkdir()
    (sweep / "linear-seed0" / "failed.json").write_text(json.dumps(
        {"attention": "linear", "seed": 0, "reason": "diverged: loss is NaN"}))
    (sweep / "luna-seed0").mkdir()  # started, not finished: left out as by the sweep
    (sweep / "table.md").write_text("| an earlier table |\n")
    assert cli.main(["table", str(sweep)]) == 0
    folder = capsys.readouterr().out
    assert "| softmax (quick) | 40.00 ± 14.14 (n=2) | 40.00 |" in folder
    assert f"| {sweep}/linear-seed0 | linear | 0 | diverged: loss is NaN |" in folder
    assert cli.main(["table", *sorted(str(p) for p in sweep.glob("*") if p.name != "luna-seed0")
                     ]) == 0
    assert capsys.readouterr().out == folder

    (tmp_path / "empty").mkdir()
    assert cli.main(["table", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == (
        f"spectral-jax table: error: run {str(tmp_path / 'empty')!r} has no results.json "
        "(not finished, or not a run directory), and holds no run folders with a results.json "
        "or failed.json (not a sweep folder)\n")


@pytest.mark.parametrize("folder", ["listops_quick", "fmnist_quick"])
def test_readme_tables_come_from_the_committed_runs(folder, capsys):
    assert cli.main(["table", str(ROOT / "benchmarks" / folder / "runs"), "--format",
                     "readme"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0] == ("| method | seeds | test accuracy (%) | vs softmax | train examples/s "
                        "| train-step peak | parameters |")
    assert len(table) == 2 + 16
    assert "\n".join(table) in (ROOT / "benchmarks" / folder / "README.md").read_text()


def test_spt_readme_table_comes_from_the_committed_runs(capsys):
    path = ROOT / "benchmarks" / "lra_spt" / "table.py"
    spec = importlib.util.spec_from_file_location("lra_spt_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(str(ROOT / "benchmarks" / "lra_spt" / "quick"))
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    # 4 methods x {scratch, SPT, RoPE, RoPE+SPT}, two seeds in every cell.
    assert len(table) == 2 + 4 and table[2].startswith("| `softmax` |")
    assert all(line.count("(") == 4 and "—" not in line for line in table[2:])
    assert "\n".join(table) in (ROOT / "benchmarks" / "lra_spt" / "README.md").read_text()


def test_readme_format_compares_each_row_with_its_own_baseline():
    preset = _preset()
    rows = [_record("softmax", accuracy=0.465, config=preset),
            _record("linear", accuracy=0.43, config=_preset("linear")),
            _record("local", accuracy=0.4648, config=_preset("local")),
            _record("softmax", accuracy=0.5, config=_changed(preset, train__steps=300),
                    run="s300"),
            _record("nystrom", seed=0, accuracy=0.51, run="n0",
                    config=_changed(_preset("nystrom"), train__steps=300)),
            _record("nystrom", seed=1, accuracy=0.52, run="n1",
                    config=_changed(_preset("nystrom"), train__steps=300, seed=1)),
            _record("luna", accuracy=0.2, config=_changed(_preset("luna"), train__steps=50))]
    lines = table_readme.readme_tables(rows).splitlines()
    assert lines[0] == "ListOps:"
    assert lines[4:] == [
        "| `softmax` (quick) | 1 | 46.50 | — | 100 | 64 MiB | 1,000 |",
        "| `softmax` (quick, steps=300) | 1 | 50.00 | — | 100 | 64 MiB | 1,000 |",
        "| `nystrom` (quick, steps=300) | 2 | 51.50 ± 0.71 | +1.5 | 100 | 64 MiB | 1,000 |",
        "| `linear` (quick) | 1 | 43.00 | **-3.5** | 100 | 64 MiB | 1,000 |",
        "| `luna` (quick, steps=50) | 1 | 20.00 | — | 100 | 64 MiB | 1,000 |",
        "| `local` (quick) | 1 | 46.48 | 0.0 | 100 | 64 MiB | 1,000 |",
    ]
    with pytest.raises(ValueError, match="results has no finished run"):
        table_readme.readme_tables([{"run": "x", "failed": True, "reason": "crashed"}])


def test_plot_title_names_the_task_methods_and_what_ran(tmp_path, monkeypatch):
    figures, new_figure = [], table_plot.new_figure

    def capture(mpl, **kwargs):
        figures.append(new_figure(mpl, **kwargs))
        return figures[-1]

    monkeypatch.setattr(table_plot, "new_figure", capture)
    rows = [_record(m, config=_changed(_preset(m), train__steps=300), accuracy=0.4 + i / 100)
            for i, m in enumerate(("softmax", "nystrom", "spectral_shift"))]
    groups = group_runs(rows)
    assert table_plot.plot_accuracy_vs_throughput(groups, tmp_path / "a.png") == tmp_path / "a.png"
    [ax] = figures[0].axes
    assert ax.get_title() == ("ListOps, 3 methods: softmax, nystrom, spectral_shift "
                              "(quick, steps=300)")
    assert sorted(t.get_text() for t in ax.texts) == ["nystrom", "softmax", "spectral_shift"]
    every = [{"task": "listops", "attention": m} for m in available_attentions()]
    assert table_plot.default_title(every) == f"ListOps, all {len(every)} methods"
    assert table_plot.default_title(every[:6]) == "ListOps, 6 methods"


def test_full_table_labels_rows_by_what_ran():
    rows = [_record(config=_changed(_preset(), train__steps=2000))]
    assert markdown_table(rows).splitlines()[2] == (
        "| softmax (quick, steps=2000) | 40.00 | 40.00 |")


def test_self_pretrained_runs_are_labelled_spt_and_cost_both_stages():
    """An SPT run is compared with the preset's ``spt`` form: the mask id its recorded
    vocabulary gained is no change, and its steps and wall time count the pretraining."""
    spt = recorded_config(load_config("lra/listops:quick,attention=nystrom,spt")).to_dict()
    assert spt["train"]["pretrain_steps"] == spt["train"]["steps"] > 0
    ran = _changed(spt, model__vocab_size=spt["model"]["vocab_size"] + 1)  # + the mask id
    label = lambda config: table_labels.run_label(_record("nystrom", config=config))  # noqa: E731
    assert label(ran) == "nystrom (quick, spt)"
    assert label(_changed(ran, train__pretrain_steps=2000, train__steps=2000)) == (
        "nystrom (quick, spt, pretrain_steps=2000, steps=2000)")
    # Without pretraining, a grown vocabulary is a change like any other.
    plain = _preset("nystrom")
    assert label(_changed(plain, model__vocab_size=plain["model"]["vocab_size"] + 1)) == (
        f"nystrom (quick, vocab_size={plain['model']['vocab_size'] + 1})")
    rows = [_record("nystrom", seed=s, config=ran, wall_time_s=60.0 + s,
                    pretrain={"steps": 3500, "wall_time_s": 120.0}) for s in (0, 1)]
    (group,) = group_runs(rows)
    assert group["wall_time_s"]["values"] == [180.0, 181.0]
    last = markdown_table(rows).splitlines()[-1]
    assert last.endswith("| 10 + 3500 pretraining | 3m01s |"), last
