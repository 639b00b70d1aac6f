"""Picking an rng stream with fallbacks, so every module builds from ``nnx.Rngs(0)`` too."""

from __future__ import annotations

from flax import nnx


def stream(rngs: nnx.Rngs, *names: str) -> nnx.RngStream:
    """The first of the named streams that ``rngs`` has, else its default stream.

    Falling back lets ``nnx.Rngs(0)`` and Linen's ``init`` (which only has ``"params"``) build
    every module.
    """
    for name in names:
        if name in rngs:
            return rngs[name]
    return rngs[names[0]]
