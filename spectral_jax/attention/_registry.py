"""One registry of attention methods: the modules, configs and parametrised tests use it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

from spectral_jax.attention._linear import linear_attention
from spectral_jax.attention._linformer import linformer_attention
from spectral_jax.attention._nystrom import nystrom_attention
from spectral_jax.attention._performer import performer_attention
from spectral_jax.attention._skyformer import kernelized_attention, skyformer_attention
from spectral_jax.attention._softmax import softmax_attention
from spectral_jax.attention._spectral_shift import spectral_shift_attention


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What a caller needs to know about one registered method.

    Attributes:
      name: the short registry name.
      fn: the pure attention function.
      supports_causal: whether ``is_causal=True`` is implemented.
      state: what a module must own and pass in: ``"projection"`` (Performer's random
        features), ``"linformer"`` (Linformer's E/F projections), ``"rng"`` (Skyformer's
        landmark sampling) or None.
      target: the exact attention the method approximates (``"softmax"`` or ``"kernelized"``).
      exact: whether the method is itself exact.
    """

    name: str
    fn: Callable[..., object]
    supports_causal: bool
    state: Literal["projection", "linformer", "rng"] | None
    target: Literal["softmax", "kernelized"]
    exact: bool = False


ATTENTIONS: dict[str, AttentionSpec] = {
    spec.name: spec
    for spec in (
        AttentionSpec("softmax", softmax_attention, True, None, "softmax", exact=True),
        AttentionSpec("nystrom", nystrom_attention, False, None, "softmax"),
        AttentionSpec("spectral_shift", spectral_shift_attention, False, None, "softmax"),
        AttentionSpec("skyformer", skyformer_attention, False, "rng", "kernelized"),
        AttentionSpec("kernelized", kernelized_attention, False, None, "kernelized", exact=True),
        AttentionSpec("linear", linear_attention, True, None, "softmax"),
        AttentionSpec("performer", performer_attention, True, "projection", "softmax"),
        AttentionSpec("linformer", linformer_attention, False, "linformer", "softmax"),
    )
}


def available_attentions() -> tuple[str, ...]:
    """The registered method names, e.g. ``("softmax", "nystrom", ...)``.

    Example:
      >>> from spectral_jax.attention import available_attentions
      >>> "spectral_shift" in available_attentions()
      True
    """
    return tuple(ATTENTIONS)


def get_attention_spec(name: str) -> AttentionSpec:
    """The :class:`AttentionSpec` registered under ``name``.

    Raises:
      ValueError: unknown name; the message lists the known ones.

    Example:
      >>> from spectral_jax.attention import get_attention_spec
      >>> get_attention_spec("performer").supports_causal
      True
    """
    if not isinstance(name, str) or name not in ATTENTIONS:
        raise ValueError(
            f"Unknown attention {name!r}; known attentions: {', '.join(ATTENTIONS)}."
        )
    return ATTENTIONS[name]


def get_attention(name: str) -> Callable[..., object]:
    """The attention function registered under ``name``.

    Args:
      name: one of :func:`available_attentions`.

    Returns:
      The pure function, with the ``jax.nn.dot_product_attention`` call shape.

    Raises:
      ValueError: unknown name; the message lists the known ones.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention import get_attention
      >>> x = jnp.ones((1, 8, 2, 4))
      >>> get_attention("nystrom")(x, x, x, num_landmarks=4).shape
      (1, 8, 2, 4)
    """
    return get_attention_spec(name).fn
