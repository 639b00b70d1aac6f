"""Issue 15: the command line as a new user meets it (configs, overrides, output)."""

from __future__ import annotations

import json
import pathlib

import pytest

from spectral_jax.lra import cli
from spectral_jax.lra.cli.train import load_config
from spectral_jax.lra.train.report import Reporter

ROOT = pathlib.Path(__file__).resolve().parents[1]

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


def test_bench_without_out_writes_into_the_ignored_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["bench", "speed", "--methods", "nystrom", "--lengths", "32", "--heads", "1",
                   "--head-dim", "4", "--budget", "num_landmarks=4", "--repeats", "1",
                   "--modes", "fwd"])
    assert rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_out"]
    assert sorted(p.name for p in (tmp_path / "bench_out").iterdir()) == ["speed.json",
                                                                          "speed.png"]
    assert "wrote bench_out/speed.json and bench_out/speed.png" in capsys.readouterr().out
    assert cli.build_parser().parse_args(["bench", "error"]).out == "bench_out/error"
    assert "/bench_out/" in (ROOT / ".gitignore").read_text().split()


def test_config_command_prints_the_config_a_run_records(capsys):
    assert cli.main(["config", f"{ROOT}/configs/lra/listops.py:quick",
                     "--config.train.steps=10", "--config.data.dir", "elsewhere"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["steps"] == 10 and printed["task"] == "listops"
    assert printed["data"]["dir"] == str(pathlib.Path("elsewhere").resolve())
    assert printed["model"]["attention_kwargs"] == {
        "num_landmarks": 16, "pinv_iterations": 6, "shift": "paired", "num_delta_rows": None}
    assert cli.main(["config", f"{ROOT}/configs/lra/listops.py:quick",
                     "--config.train.steps=0"]) == 2
    assert "train.steps" in capsys.readouterr().err


def _load(spec: str, *overrides: str):
    return load_config(f"{ROOT}/configs/lra/{spec}", list(overrides))


def test_budgets_are_capped_after_length_overrides():
    # The input: at 100 tokens every budget is capped at 64, not the preset's 256/128.
    for method, budget in (("linformer", "proj_len"), ("performer", "num_features"),
                           ("skyformer", "num_landmarks")):
        cfg = _load(f"text.py:attention={method},protocol=small",
                    "data.options.max_length=100", "model.max_length=100")
        assert cfg.model.attention_kwargs[budget] == 64, method
    # A preset's own choice stays when the length grows; a capped default comes back.
    assert _load("listops.py:quick,attention=performer",
                 "model.max_length=1000").model.attention_kwargs.num_features == 64
    assert _load("listops.py:quick,attention=skyformer",
                 "model.max_length=40").model.attention_kwargs.num_landmarks == 16
    assert _load("listops.py:attention=performer,protocol=small",
                 "model.max_length=48").model.attention_kwargs.num_features == 32
    # An explicit value is the user's: kept as given, whatever the cap and the order.
    cfg = _load("text.py:attention=nystrom,protocol=small",
                "model.attention_kwargs.num_landmarks=512", "model.max_length=100")
    assert cfg.model.attention_kwargs.num_landmarks == 512


def test_switching_the_method_by_override_equals_the_config_argument():
    for method in ("linformer", "softmax", "nystrom"):
        for preset in ("text.py:protocol=small", "listops.py:quick"):
            switched = _load(preset, f"model.attention={method}").to_dict()
            direct = _load(f"{preset},attention={method}").to_dict()
            assert switched == direct, (method, preset)
    cfg = _load("listops.py:quick", "model.attention_kwargs.proj_len=8",
                "model.attention=linformer")
    assert cfg.model.attention_kwargs.to_dict() == {"proj_len": 8}
    cfg = _load("text.py:protocol=small", "model.attention=softmax",
                "model.attention_dropout_rate=0.3")
    assert cfg.model.attention_dropout_rate == 0.3


def test_overrides_are_parsed_by_the_fields_type(capsys):
    for raw in ("2024", "True", "1e3", "none", "[1, 2]"):
        assert _load("listops.py:quick", f"data.dir={raw}").data.dir == raw
    assert _load("listops.py:quick", "data.dir='my data'").data.dir == "my data"
    cfg = _load("listops.py:quick", "train.steps=1e3", "train.eval_batch_size=64",
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
            _load("listops.py:quick", override)
    # A None where the field needs a value: the check names the field.
    assert cli.main(["config", f"{ROOT}/configs/lra/listops.py:quick",
                     "--config.train.steps=none"]) == 2
    assert "`train.steps`" in capsys.readouterr().err


def test_method_parameter_at_the_model_level_suggests_attention_kwargs():
    with pytest.raises(ValueError, match="no field 'model.num_landmarks'.*"
                       r"--config\.model\.attention_kwargs\.num_landmarks=VALUE$"):
        _load("listops.py:quick", "model.num_landmarks=8")
    with pytest.raises(ValueError, match="attention_kwargs.num_features=VALUE with a method "
                       "that takes it \\(performer"):
        _load("listops.py:quick", "model.num_features=8")
    with pytest.raises(ValueError, match="did you mean model.embed_dim"):
        _load("listops.py:quick", "model.embed_dims=8")
