"""Issue 15: the command line as a new user meets it (configs, overrides, output)."""

from __future__ import annotations

import pathlib

from spectral_jax.train.progress import Reporter

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
    from spectral_jax import cli

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
    import json

    from spectral_jax import cli

    assert cli.main(["config", f"{ROOT}/configs/lra/listops.py:quick",
                     "--config.train.steps=10", "--config.data.dir", "elsewhere"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["steps"] == 10 and printed["task"] == "listops"
    assert printed["data"]["dir"] == str(pathlib.Path("elsewhere").resolve())
    assert printed["model"]["attention_kwargs"] == {"num_landmarks": 16, "pinv_iterations": 6}
    assert cli.main(["config", f"{ROOT}/configs/lra/listops.py:quick",
                     "--config.train.steps=0"]) == 2
    assert "train.steps" in capsys.readouterr().err
