"""Checks a core-only install: the library imports and runs with jax, flax and numpy alone.

Run inside a fresh venv where only ``pip install .`` was done. Fails when a distribution is
installed that jax, flax and numpy (and their own dependencies) do not pull in, when the
harness's dependencies are present, or when a Nyström call does not give finite outputs.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extras(requirement: str) -> set[str]:
    found = re.match(r"[^\[;]*\[([^\]]*)\]", requirement)
    return {e.strip().lower() for e in found.group(1).split(",")} if found else set()


def closure(roots: list[str]) -> set[str]:
    """The distributions that ``roots`` need, with the extras their requirements ask for."""
    seen, todo = set(), [(r.lower(), frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            marker = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
            if marker and marker.group(1).lower() not in extras:
                continue
            todo.append((_name(req), frozenset(_extras(req))))
    return {name for name, _ in seen}


def main() -> int:
    installed = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
    allowed = closure(["jax", "jaxlib", "flax", "numpy"]) | {"spectral-jax", "pip", "setuptools",
                                                             "wheel"}
    extra = sorted(installed - allowed)
    if extra:
        print(f"core install brought distributions beyond jax/flax/numpy: {extra}")
        return 1
    import jax
    import numpy as np

    import spectral_jax.linen
    import spectral_jax.nn
    from spectral_jax import attention

    q = jax.random.normal(jax.random.key(0), (2, 64, 2, 8))
    out = attention.nystrom_attention(q, q, q, num_landmarks=8)
    assert out.shape == q.shape and bool(np.isfinite(np.asarray(out)).all())
    assert not any(m.startswith("spectral_jax.lra") for m in sys.modules), "harness imported"
    try:
        import spectral_jax.lra.train  # noqa: F401  (must fail: the extra is not installed)
    except ModuleNotFoundError as err:
        assert "spectral_jax[lra]" in str(err), err
    else:
        print("spectral_jax.lra.train imported without the lra extra")
        return 1
    print(f"core install ok: {len(installed)} distributions, nystrom output {out.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
