"""``spectral-jax train | config | eval | table``: config loading, overrides, exit codes, console
output, the table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import pytest

from spectral_jax.lra import cli as entry_point
from spectral_jax.lra.cli import train as cli
from spectral_jax.lra.train.report import Reporter
from spectral_jax.lra.train.table import markdown_table

ROOT = Path(__file__).resolve().parents[1]
LISTOPS = "lra/listops"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spectral-jax")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_overrides_parse_both_forms_and_keep_types():
    args = parse(["train", "--config", f"{LISTOPS}:quick", "--workdir", "w",
                  "--config.train.steps=7", "--config.model.pooling", "cls",
                  "--config.train.grad_clip_norm=none", "--overwrite"])
    assert args.overwrite and args.func is cli._train
    assert args.config_overrides == ["train.steps=7", "model.pooling=cls",
                                     "train.grad_clip_norm=none"]
    cfg = cli.load_config(args.config, args.config_overrides)
    assert (cfg.train.steps, cfg.model.pooling, cfg.train.grad_clip_norm) == (7, "cls", None)
    cfg = cli.load_config(f"{LISTOPS}:quick", ["train.optimizer.learning_rate=1",
                                               "data.options.max_length=64"])
    assert cfg.train.optimizer.learning_rate == 1.0  # an int literal for a float field
    assert cfg.data.options.max_length == 64


@pytest.mark.parametrize("override, message", [
    ("train.stepz=3", r"--config.train.stepz: no field 'train.stepz'.*did you mean train.steps"),
    ("train.steps='many'", r"--config.train.steps='many': train.steps is an int field"),
    ("train.steps", r"expected --config.FIELD=VALUE"),
])
def test_bad_overrides(override, message):
    with pytest.raises(ValueError, match=message):
        cli.load_config(f"{LISTOPS}:quick", [override])


def test_missing_config_file():
    with pytest.raises(FileNotFoundError, match=r"no config file at 'nope.py'"):
        cli.load_config("nope.py:quick")


def test_train_exit_code_and_message_for_config_errors(tmp_path, capsys):
    # Reported by the entry point, the same way for every subcommand.
    assert entry_point.main(["train", "--config", f"{LISTOPS}:quick", "--workdir",
                             str(tmp_path / "w"), "--config.train.batch_size=12"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectral-jax train: error: config: `train.batch_size` must be a "
                          f"positive multiple of the device count {jax.device_count()}")
    assert err.count("\n") == 1


def test_train_eval_roundtrip(tmp_path, capsys):
    workdir = tmp_path / "run"
    overrides = [
        f"--config.data.dir={tmp_path / 'lo'}", "--config.data.generate.num_train=32",
        "--config.data.generate.num_val=8", "--config.data.generate.num_test=8",
        "--config.data.generate.min_length=8", "--config.data.generate.max_length=24",
        "--config.data.generate.max_depth=3", "--config.data.options.max_length=24",
        "--config.model.max_length=24", "--config.model.num_layers=1",
        "--config.model.attention_kwargs.num_landmarks=4", "--config.train.steps=2",
        "--config.train.eval_every=1", "--config.train.batch_size=8",
    ]
    args = parse(["train", "--config", f"{LISTOPS}:quick", "--workdir", str(workdir),
                  *overrides])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    results = json.loads((workdir / "results.json").read_text())
    assert f"test accuracy {results['test_accuracy']:.4f}" in out
    baseline = results["majority_baseline"]
    assert f"majority-class baseline of the test split {baseline:.4f}" in out
    args = parse(["eval", "--workdir", str(workdir), "--checkpoint", "latest"])
    assert args.func(args) == 0
    evaluated = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert evaluated["step"] == 2 and evaluated["count"] == 8
    assert evaluated["accuracy"] == pytest.approx(results["final_test_accuracy"])
    assert evaluated["loss"] == pytest.approx(results["final_test_loss"], rel=1e-5)
    args = parse(["eval", "--workdir", str(workdir), "--checkpoint", "best"])
    assert args.func(args) == 0
    best = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert best["step"] == results["best_step"]
    assert best["accuracy"] == pytest.approx(results["test_accuracy"])


def _result(task, attention, acc, protocol="lra", seed=0):
    return {"run": f"runs/{task}_{attention}_{seed}", "task": task, "attention": attention,
            "protocol": protocol, "seed": seed, "test_accuracy": acc,
            "final_test_accuracy": acc - 0.01, "majority_baseline": 0.1, "steps": 5000,
            "wall_time_s": 3725.0}


def test_markdown_table_layout():
    rows = [_result("listops", "softmax", 0.37), _result("text", "softmax", 0.65),
            _result("listops", "nystrom", 0.36), _result("listops", "nystrom", 0.38, seed=1)]
    lines = markdown_table(rows).splitlines()
    assert lines[0] == "| Model | ListOps | Text | Avg |"
    assert lines[2] == "| softmax (lra) | 37.00 | 65.00 | 51.00 |"
    assert lines[3] == "| nystrom (lra) | 37.00 ± 1.41 (n=2) | – | 37.00 |"
    assert ("| runs/listops_softmax_0 | ListOps | softmax | lra | 0 | 37.00 | 36.00 "
            "| 10.00 | 5000 | 1h02m |") in lines
    with pytest.raises(ValueError, match="results is empty"):
        markdown_table([])


def test_table_groups_only_runs_that_differ_in_the_seed():
    def run(seed, steps, acc, rate):
        config = {"seed": seed, "task": "listops", "train": {"steps": steps, "batch_size": 32}}
        return {**_result("listops", "nystrom", acc, seed=seed), "config": config,
                "run": f"r{steps}_{seed}", "examples_per_s": rate, "steps_per_s": rate / 32,
                "train_step_peak_bytes": 3 * 2**20, "num_params": 1000}

    rows = [run(0, 100, 0.30, 90.0), run(1, 100, 0.40, 110.0), run(0, 200, 0.50, 100.0)]
    lines = markdown_table(rows).splitlines()
    assert lines[2] == "| nystrom (lra, steps=100) | 35.00 ± 7.07 (n=2) | 35.00 |"
    assert lines[3] == "| nystrom (lra, steps=200) | 50.00 | 50.00 |"
    assert lines[7] == ("| ListOps | nystrom (lra, steps=100) | 2 | 35.00 ± 7.07 (n=2) "
                        "| 100.0 ± 14.1 | 3.12 | 3.0 MiB | 1,000 | 1h02m |")


def test_table_command_reads_runs(tmp_path, capsys):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(_result("image", "performer", 0.42)))
    args = parse(["table", str(run)])
    assert args.func(args) == 0
    assert "| performer (lra) | 42.00 | 42.00 |" in capsys.readouterr().out
    assert entry_point.main(["table", str(tmp_path / "missing")]) == 2
    assert "has no results.json" in capsys.readouterr().err


RESULTS = {
    "task": "listops", "attention": "spectral_shift", "protocol": "quick",
    "test_accuracy": 0.4321, "best_step": 3000, "final_test_accuracy": 0.4200,
    "majority_baseline": 0.1700, "steps": 3500, "wall_time_s": 1234.0,
}


def test_summary_line_is_not_wrapped_when_not_a_terminal(capsys):
    reporter = Reporter(10)
    reporter.validation(3000, {"loss": 1.234567, "accuracy": 0.4321}, 0.4321)
    reporter.summary(RESULTS)
    reporter.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines[-1] == (
        "listops / spectral_shift (quick): test accuracy 0.4321 (best validation, step 3000), "
        "final 0.4200; majority-class baseline of the test split 0.1700. 3500 steps in 1234 s."
    )
    assert lines[0] == "step 3000: validation loss 1.235 accuracy 0.4321 (best 0.4321)"
    assert len(lines) == 2


def test_summary_line_times_the_pretraining_stage_too(capsys):
    reporter = Reporter(10)
    reporter.summary({**RESULTS, "pretrain": {"steps": 3500, "wall_time_s": 987.6}})
    reporter.close()
    assert capsys.readouterr().out.strip().endswith(
        "3500 steps in 1234 s, after 3500 pretraining steps in 988 s.")


def test_config_command_prints_the_config_a_run_records(capsys):
    assert entry_point.main(["config", "lra/listops:quick",
                     "--config.train.steps=10", "--config.data.dir", "elsewhere"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["steps"] == 10 and printed["task"] == "listops"
    assert printed["data"]["dir"] == str(Path("elsewhere").resolve())
    assert printed["model"]["attention_kwargs"] == {
        "num_landmarks": 16, "pinv_iterations": 6, "shift": "paired", "num_delta_rows": None}
    assert entry_point.main(["config", "lra/listops:quick",
                     "--config.train.steps=0"]) == 2
    assert "train.steps" in capsys.readouterr().err


def _load(spec: str, *overrides: str):
    return cli.load_config(f"lra/{spec}", list(overrides))


def test_budgets_are_capped_after_length_overrides():
    # At 100 tokens every budget is capped at 64, not the preset's 256/128.
    for method, budget in (("linformer", "proj_len"), ("performer", "num_features"),
                           ("skyformer", "num_landmarks")):
        cfg = _load(f"text:attention={method},protocol=small",
                    "data.options.max_length=100", "model.max_length=100")
        assert cfg.model.attention_kwargs[budget] == 64, method
    # A preset's own choice stays when the length grows; a capped default comes back.
    assert _load("listops:quick,attention=performer",
                 "model.max_length=1000").model.attention_kwargs.num_features == 64
    assert _load("listops:quick,attention=skyformer",
                 "model.max_length=40").model.attention_kwargs.num_landmarks == 16
    assert _load("listops:attention=performer,protocol=small",
                 "model.max_length=48").model.attention_kwargs.num_features == 32
    # An explicit value is the user's: kept as given, whatever the cap and the order.
    cfg = _load("text:attention=nystrom,protocol=small",
                "model.attention_kwargs.num_landmarks=512", "model.max_length=100")
    assert cfg.model.attention_kwargs.num_landmarks == 512


def test_switching_the_method_by_override_equals_the_config_argument():
    for method in ("linformer", "softmax", "nystrom"):
        for preset in ("text:protocol=small", "listops:quick"):
            switched = _load(preset, f"model.attention={method}").to_dict()
            direct = _load(f"{preset},attention={method}").to_dict()
            assert switched == direct, (method, preset)
    cfg = _load("listops:quick", "model.attention_kwargs.proj_len=8",
                "model.attention=linformer")
    assert cfg.model.attention_kwargs.to_dict() == {"proj_len": 8}
    cfg = _load("text:protocol=small", "model.attention=softmax",
                "model.attention_dropout_rate=0.3")
    assert cfg.model.attention_dropout_rate == 0.3


def test_overrides_are_parsed_by_the_fields_type(capsys):
    for raw in ("2024", "True", "1e3", "none", "[1, 2]"):
        assert _load("listops:quick", f"data.dir={raw}").data.dir == raw
    assert _load("listops:quick", "data.dir='my data'").data.dir == "my data"
    cfg = _load("listops:quick", "train.steps=1e3", "train.eval_batch_size=64",
                "model.use_bias=no", "model.dropout_rate=1e-1", "train.grad_clip_norm=2",
                "model.attention_kwargs.pinv_iterations=8")
    assert (cfg.train.steps, cfg.train.eval_batch_size, cfg.model.use_bias) == (1000, 64, False)
    assert (cfg.model.dropout_rate, cfg.train.grad_clip_norm) == (0.1, 2.0)
    assert cfg.model.attention_kwargs.pinv_iterations == 8
    for override, message in (
            ("train.eval_batch_size=big", "train.eval_batch_size is an int field"),
            ("train.steps=2.5", "train.steps is an int field"),
            ("model.use_bias=maybe", "model.use_bias is a bool field; expected true or false"),
            ("model.attention_kwargs.pinv_iterations=x", "pinv_iterations is an int field"),
            ("model.attention_kwargs.proj_len=3",
             "takes no 'proj_len'.*parameter of \\['linformer'\\]")):
        with pytest.raises(ValueError, match=message):
            _load("listops:quick", override)
    # A None where the field needs a value: the check names the field.
    assert entry_point.main(["config", "lra/listops:quick",
                     "--config.train.steps=none"]) == 2
    assert "`train.steps`" in capsys.readouterr().err


def test_method_parameter_at_the_model_level_suggests_attention_kwargs():
    with pytest.raises(ValueError, match="no field 'model.num_landmarks'.*"
                       r"--config\.model\.attention_kwargs\.num_landmarks=VALUE$"):
        _load("listops:quick", "model.num_landmarks=8")
    with pytest.raises(ValueError, match="attention_kwargs.num_features=VALUE with a method "
                       "that takes it \\(performer"):
        _load("listops:quick", "model.num_features=8")
    with pytest.raises(ValueError, match="did you mean model.embed_dim"):
        _load("listops:quick", "model.embed_dims=8")
