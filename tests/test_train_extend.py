"""``--extend``: continuing a finished run to more ``train.steps``.

Tiny generated ListOps on the suite's 8 simulated CPU devices: a 4-step run extended to 8.
With a schedule that does not depend on ``train.steps`` the extended run equals an 8-step
run exactly; with ``linear`` and ``cosine`` the rates after step 4 are the 8-step schedule's.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from spectral_jax.lra import cli as entry_point
from spectral_jax.lra.train import checkpoint as checkpoint_lib
from spectral_jax.lra.train.loop import train_and_evaluate
from spectral_jax.lra.train.overrides import load_config
from spectral_jax.lra.train.report import read_metrics
from spectral_jax.lra.train.run import open_for_training
from spectral_jax.lra.train.steps import make_schedule

ROOT = Path(__file__).resolve().parents[1]
SPEC = "lra/listops:quick,attention=softmax"


def _overrides(data_dir: Path, steps: int, schedule: str) -> list[str]:
    return [
        f"data.dir={data_dir}", f"train.steps={steps}", "train.batch_size=8",
        "train.eval_every=2", "train.log_every=1", "train.eval_steps=-1",
        f"train.schedule.name='{schedule}'", "train.schedule.warmup_steps=1",
        "model.num_layers=1", "model.embed_dim=16", "model.qkv_dim=16", "model.mlp_dim=32",
        "model.dropout_rate=0.1", "model.max_length=32", "data.options.max_length=32",
        "data.generate.num_train=48", "data.generate.num_val=16", "data.generate.num_test=12",
        "data.generate.min_length=8", "data.generate.max_length=32", "data.generate.max_depth=3",
    ]


def _config(root: Path, steps: int, schedule: str = "constant"):
    return load_config(SPEC, _overrides(root / "listops", steps, schedule))


def _records(workdir: Path, split: str | None = None) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_per_s")}
            for r in read_metrics(str(workdir / "metrics.jsonl"))
            if split is None or r["split"] == split]


def _params(workdir: Path, step: int, like) -> dict:
    ckpt = checkpoint_lib.Checkpointer(str(workdir / "checkpoints"), keep=3)
    try:
        return jax.device_get(nnx.to_pure_dict(ckpt.restore(step, like)[0]))
    finally:
        ckpt.close()


def test_extend_with_a_constant_schedule_equals_the_longer_run(tmp_path):
    short, longer = _config(tmp_path, 4), _config(tmp_path, 8)
    first = train_and_evaluate(short, str(tmp_path / "run"))
    assert first["extensions"] == []
    with pytest.raises(ValueError, match=r"train\.steps: 4 there, 8 now.*or --extend to "
                                         r"continue it to train\.steps=8"):
        train_and_evaluate(longer, str(tmp_path / "run"))
    extended = train_and_evaluate(longer, str(tmp_path / "run"), extend=True)
    reference = train_and_evaluate(longer, str(tmp_path / "reference"))

    run = tmp_path / "run"
    assert extended["steps"] == 8 and json.loads((run / "config.json").read_text())[
        "train"]["steps"] == 8
    kept = {k: first[k] for k in ("steps", "best_step", "best_val_accuracy", "test_accuracy",
                                  "final_test_accuracy", "wall_time_s")}
    entry = {"from_steps": 4, "to_steps": 8, "at_step": 4, "results": kept}
    assert extended["extensions"] == [entry]
    assert json.loads((run / "results.json").read_text())["extensions"] == [entry]
    assert _records(run, "extend") == [{"step": 4, "split": "extend", "from_steps": 4,
                                        "to_steps": 8}]
    others = [r for r in _records(run) if r["split"] != "extend"]
    assert others == _records(tmp_path / "reference")
    for key in ("test_loss", "final_test_loss", "best_step", "best_val_accuracy"):
        assert extended[key] == reference[key], key
    with open_for_training(longer, str(tmp_path / "reference")) as opened:
        like = opened.setup.state
    jax.tree.map(np.testing.assert_array_equal, _params(run, 8, like),
                 _params(tmp_path / "reference", 8, like))

    # The same --extend command again is a plain resume: nothing recorded twice.
    with open_for_training(longer, str(run), extend=True) as again:
        assert again.extension is None
    assert json.loads((run / "extensions.json").read_text()) == [entry]


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_extend_re_evaluates_a_decaying_schedule_for_the_new_total(tmp_path, schedule):
    short, longer = _config(tmp_path, 4, schedule), _config(tmp_path, 8, schedule)
    train_and_evaluate(short, str(tmp_path / "run"))
    train_and_evaluate(longer, str(tmp_path / "run"), extend=True)
    rates = [r["learning_rate"] for r in _records(tmp_path / "run", "train")]
    # The rate logged at step s is the one applied by step s, schedule(s - 1).
    old, new = make_schedule(short), make_schedule(longer)
    want = [float(old(s - 1)) for s in range(1, 5)] + [float(new(s - 1)) for s in range(5, 9)]
    np.testing.assert_allclose(rates, want, rtol=1e-6)  # jitted vs eager: float32 rounding
    lr = longer.train.optimizer.learning_rate
    # Step 5 applies schedule(4); warmup 1, so the decay covers 7 steps of the new total.
    stretched = {"linear": lr * (1 - 3 / 7), "cosine": lr * 0.5 * (1 + np.cos(np.pi * 3 / 8))}
    assert rates[4] == pytest.approx(stretched[schedule], rel=1e-6)
    assert rates[4] > rates[3]  # the first new step rises from the short run's decayed rate


def test_extend_refusals(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"extend: no run to extend in workdir='.*"
                                                r"empty' \(config\.json is missing\)"):
        open_for_training(_config(tmp_path, 4), str(tmp_path / "empty"), extend=True)
    with open_for_training(_config(tmp_path, 4), str(tmp_path / "run")):
        pass
    with pytest.raises(ValueError, match=r"extend: `train\.steps` must be >= 4, the train\."
                                         r"steps of the run in workdir='.*run' \(an extension "
                                         r"adds steps\); got 2"):
        open_for_training(_config(tmp_path, 2), str(tmp_path / "run"), extend=True)
    other = _config(tmp_path, 8)
    other.seed = 3
    with pytest.raises(ValueError, match=r"differs in more than train\.steps \(seed: 0 there, "
                                         r"3 now\); an extension changes train\.steps alone"):
        open_for_training(other, str(tmp_path / "run"), extend=True)
    with pytest.raises(ValueError, match=r"extend and overwrite exclude each other"):
        open_for_training(_config(tmp_path, 8), str(tmp_path / "run"), extend=True,
                          overwrite=True)
    # On the command line: one error line, exit status 2.
    argv = ["train", "--config", SPEC, "--workdir", str(tmp_path / "none"), "--extend",
            *(f"--config.{o}" for o in _overrides(tmp_path / "listops", 8, "constant"))]
    assert entry_point.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("spectral-jax train: error: extend: no run to extend in workdir=")
    assert err.count("\n") == 1
    help_text = entry_point.build_parser()._subparsers._group_actions[0].choices[
        "train"].format_help()
    assert "schedule is re-evaluated for the new total" in " ".join(help_text.split())
