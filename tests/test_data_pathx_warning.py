"""Loading Path-X warns once about the LRA release's known fault."""

from __future__ import annotations

import pytest


def test_pathx_warns_once_naming_lra_issue_38(tmp_path, monkeypatch):
    import warnings

    from spectral_jax.lra.data import pathfinder
    pathfinder.generate(tmp_path, resolution=128, num_images=2, seed=0)
    monkeypatch.setattr(pathfinder, "_warned_pathx", False)
    with pytest.warns(UserWarning, match=r"pathfinder128.*long-range-arena issue #38"):
        task = pathfinder.load(tmp_path, resolution=128, name="pathx")
    assert task.splits["train"].inputs.shape[1] == 128 * 128
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: not again
        pathfinder.load(tmp_path, resolution=128, name="pathx")
        pathfinder.generate(tmp_path / "small", resolution=32, num_images=2, seed=0)
        pathfinder.load(tmp_path / "small", resolution=32)  # 32x32 never warns
