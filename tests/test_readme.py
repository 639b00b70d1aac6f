"""The README: its Python snippets run as written, it fits two screens, and its method table is
the registry's."""

from __future__ import annotations

import pathlib
import re

from spectral_jax.attention import ATTENTIONS, available_attentions

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_snippets_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    namespaces = []
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
        namespaces.append(namespace)
    attention, modules = namespaces[0], namespaces[1]
    assert attention["y"].shape == (2, 512, 4, 64)
    assert modules["y"].shape == (2, 256, 128)
    assert modules["logits"].shape == (2, 10)


def test_readme_fits_two_screens():
    assert len(README.read_text().splitlines()) <= 150


def test_readme_method_table_is_the_registry():
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$", README.read_text(), re.M)
    assert [name for name, _, _ in rows] == list(available_attentions())
    for name, cost, causal in rows:
        spec = ATTENTIONS[name]
        assert cost.strip() == spec.cost, name
        expected = ("causal only" if spec.causal_only
                    else "yes" if spec.supports_causal else "no")
        assert causal.strip() == expected, name


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "spectral-jax train --config lra/listops:quick --workdir runs/listops_quick" in text
    assert 'python -m pytest -m "not slow" -n 2' in text
