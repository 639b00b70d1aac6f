"""The README's Python snippets run as written and give the shapes their comments state."""

from __future__ import annotations

import pathlib
import re

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
