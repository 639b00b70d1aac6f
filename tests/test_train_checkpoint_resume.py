"""Checkpoints across a resume: an incomplete step directory is skipped with a warning,
and the best checkpoint is kept."""

from __future__ import annotations

import chex
import jax
import pytest


@pytest.mark.parametrize("remove", ["meta", "state/_METADATA"])
def test_incomplete_checkpoint_is_skipped_with_a_warning(tmp_path, remove):
    import shutil

    from flax import nnx

    from spectral_jax.lra.train.checkpoint import Checkpointer
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    ckpt = Checkpointer(str(tmp_path), keep=3)
    for step in (2, 4):
        ckpt.save(step, jax.tree.map(lambda x, s=step: x + s, state), {"step": step}, 0.1 * step)
    ckpt.close()
    target = tmp_path / "4" / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    # Resuming skips the incomplete step 4 (its restore would fail on the missing item).
    with pytest.warns(UserWarning, match=rf"checkpoint directory {tmp_path}/4 is incomplete "
                                         rf"\(missing {remove}.*moved to {tmp_path}/4.incomplete"):
        ckpt = Checkpointer(str(tmp_path), keep=3)
    assert ckpt.latest_step() == 2
    restored, meta = ckpt.restore(2, state)
    assert meta == {"step": 2}
    chex.assert_trees_all_close(nnx.to_pure_dict(restored),
                                nnx.to_pure_dict(jax.tree.map(lambda x: x + 2, state)))
    ckpt.save(4, state, {"step": 4}, 0.4)  # the step is saved again, no collision
    ckpt.close()
    reopened = Checkpointer(str(tmp_path), keep=3)
    assert reopened.latest_step() == 4
    reopened.close()
    assert (tmp_path / "4.incomplete").is_dir()


@pytest.mark.parametrize("metrics_on_disk", [True, False])
def test_best_checkpoint_survives_reopening(tmp_path, metrics_on_disk):
    import shutil

    from flax import nnx

    from spectral_jax.lra.train.checkpoint import Checkpointer
    state = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    ckpt = Checkpointer(str(tmp_path), keep=1)
    for step, accuracy in ((1, 0.9), (2, 0.1)):
        ckpt.save(step, state, {"step": step}, accuracy)
    ckpt.close()
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [1, 2]
    if not metrics_on_disk:  # as written before the metrics were saved
        for step in (1, 2):
            shutil.rmtree(tmp_path / str(step) / "metrics")
    # A resumed run knows every kept step's metric, so its saves never delete step 1, the
    # best, which the final test evaluation restores.
    reopened = Checkpointer(str(tmp_path), keep=1)
    for step, accuracy in ((3, 0.2), (4, 0.3)):
        reopened.save(step, state, {"step": step}, accuracy)
    reopened.close()
    kept = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert kept == ([1, 4] if metrics_on_disk else [1, 2, 4])
    _, meta = Checkpointer(str(tmp_path), keep=1).restore(1, state)
    assert meta == {"step": 1}
