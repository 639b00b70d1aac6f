"""The byte-LM task through the trainer and the CLI: bits per byte in results.json and
metrics.jsonl, resume after a kill, `spectral-jax generate` and its errors."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
from train_child import run_child

from spectral_jax import UsageError
from spectral_jax.lra.cli import main
from spectral_jax.lra.cli.generate import continuation
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.report import read_metrics

TEXT = (b"the quick brown fox jumps over the lazy dog. " * 12
        + b"a stitch in time saves nine. " * 12)


def _config(data_dir: Path, *extra: str, attention: str = "linear"):
    return load_config(f"lm/bytes:quick,attention={attention}", [
        f"data.dir={data_dir}", "data.options.context_length=16", "model.max_length=17",
        "data.options.heldout_fraction=0.1", "train.steps=6", "train.batch_size=8",
        "train.eval_every=2", "train.log_every=1", "train.schedule.warmup_steps=1",
        "model.num_layers=1", "model.embed_dim=16", "model.qkv_dim=16", "model.mlp_dim=32",
        *extra])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_bytes(TEXT)
    results = train_and_evaluate(_config(root / "corpus"), str(root / "run"))
    return root, results


def test_bits_per_byte_in_results_and_metrics(trained):
    root, results = trained
    assert results["task"] == "bytes_lm" and results["compiles"] == {"train": 1, "eval": 1}
    # Bits per byte is the test loss (nats per predicted byte) in bits.
    assert results["test_bits_per_byte"] == pytest.approx(results["test_loss"] / math.log(2))
    assert 0.0 < results["test_bits_per_byte"] < math.log2(257)
    on_disk = json.loads((root / "run" / "results.json").read_text())
    assert on_disk["final_test_bits_per_byte"] == results["final_test_bits_per_byte"]
    records = read_metrics(str(root / "run" / "metrics.jsonl"))
    val = [r for r in records if r["split"] == "validation"]
    assert [r["step"] for r in val] == [2, 4, 6]
    for r in records:
        assert r["bits_per_byte"] == pytest.approx(r["loss"] / math.log(2))
    # count is the number of predicted bytes: every validation byte after the first.
    held = round(0.1 * len(TEXT))
    assert val[0]["count"] == held - 1


# The trainer's resume is tested in tests/test_train_loop.py; the LM task's takes ~40 s.
@pytest.mark.slow
def test_resume_after_kill_continues_identically(trained, tmp_path):
    root, reference = trained
    config_json = tmp_path / "cfg.json"
    config_json.write_text(_config(root / "corpus").to_json())
    args = ["--config-json", str(config_json), str(tmp_path / "resumed")]
    killed = run_child(args, signum=signal.SIGKILL, at_step=6)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = run_child(args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resuming from the checkpoint at step" in resumed.stdout
    result = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert result["test_bits_per_byte"] == reference["test_bits_per_byte"]


def test_generate_command(trained, capsys):
    root, _ = trained
    run = str(root / "run")
    greedy = continuation(run, "the quick ", 6)
    assert main(["generate", "--workdir", run, "--prompt", "the quick ",
                 "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out == greedy + "\n"
    a = continuation(run, "the ", 5, temperature=1.0, seed=4)
    assert a == continuation(run, "the ", 5, temperature=1.0, seed=4)
    assert len(a.encode("utf-8", "replace")) >= 5 or "\ufffd" in a


def test_generate_errors(trained, tmp_path, capsys):
    root, _ = trained
    run = str(root / "run")
    assert main(["generate", "--workdir", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "no run in workdir" in capsys.readouterr().err
    # The model has 17 positions: a 12-byte prompt leaves room for 5 new bytes.
    assert main(["generate", "--workdir", run, "--prompt", "x" * 12,
                 "--max-new-tokens", "6"]) == 2
    err = capsys.readouterr().err
    assert "need 18 positions; the model has max_length=17" in err and "at most 11" in err
    assert main(["generate", "--workdir", run, "--prompt", ""]) == 2
    assert "`--prompt` is empty" in capsys.readouterr().err
    classifier = tmp_path / "listops"
    classifier.mkdir()
    (classifier / "config.json").write_text(json.dumps({"task": "listops"}))
    assert main(["generate", "--workdir", str(classifier), "--prompt", "x"]) == 2
    assert "trained task 'listops', a classifier" in capsys.readouterr().err


def test_method_without_causal_form_fails_before_training(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_bytes(TEXT)
    with pytest.raises(UsageError, match="attention='nystrom' has no causal form"):
        train_and_evaluate(_config(tmp_path / "c", attention="nystrom"), str(tmp_path / "r"))
    assert not (tmp_path / "r" / "config.json").exists()
