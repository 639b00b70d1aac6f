"""Kinds of state an attention method needs from its caller, and pure builders for them.

A registered method names one kind (``AttentionSpec.state``). The kind says which keyword
arguments of the attention function the state fills, which module options configure it (with
their defaults) and how to build it from a key for benchmarks and tests; ``spectral_jax.nn``
owns it as a small module per kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp

from spectral_jax.attention.compressed._memory_compressed import mean_pool_conv
from spectral_jax.attention.kernel._performer import orthogonal_random_features

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class StateKind:
    """One kind of caller-supplied state.

    Attributes:
      name: the kind's name, as ``AttentionSpec.state`` gives it.
      arguments: keyword arguments of the attention function the state fills.
      options: module options that configure it and their defaults (None: required).
      size: the option that sets the state's size (a method's budget), or None.
      build: ``build(rng, *, size, length, head_dim)``: the ``arguments`` as arrays, a pure
        function for benchmarks and tests (modules own learned or persistent versions).
      per_key_head: the arrays have one entry per key/value head (they act on the keys or
        on the state the keys write), so a layer with grouped-query heads builds
        ``num_kv_heads`` of them; otherwise one per query head or shared.
    """

    name: str
    arguments: tuple[str, ...]
    options: Mapping[str, Any]
    size: str | None
    build: Callable[..., dict[str, Any]]
    per_key_head: bool = False


def _random_features(rng: Array, *, size: int, length: int, head_dim: int) -> dict[str, Array]:
    del length
    return {"projection": orthogonal_random_features(rng, size, head_dim)}


def _length_projection(rng: Array, *, size: int, length: int, head_dim: int) -> dict[str, Array]:
    """One shared (size, length) projection, Xavier-uniform with gain 1/√2 (fairseq)."""
    del head_dim
    limit = (6.0 * 0.5 / (size + length)) ** 0.5
    return {"key_projection": jax.random.uniform(rng, (size, length), jnp.float32, -limit, limit)}


def _landmark_rng(rng: Array, *, size: int | None, length: int, head_dim: int) -> dict[str, Array]:
    del size, length, head_dim
    return {"rng": rng}


def _inducing_points(rng: Array, *, size: int, length: int, head_dim: int) -> dict[str, Array]:
    """m points N(0, 1) shared by every head (a heads axis of 1)."""
    del length
    return {"inducing_points": jax.random.normal(rng, (size, 1, head_dim), jnp.float32)}


def _packed_sequence(rng: Array, *, size: int, length: int, head_dim: int) -> dict[str, Array]:
    """Luna's first P, l rows N(0, 1) shared by every head (a heads axis of 1)."""
    del length
    return {"packed_query": jax.random.normal(rng, (size, 1, head_dim), jnp.float32)}


def _gates(rng: Array, *, size: int | None, length: int, head_dim: int) -> dict[str, Array]:
    """Gates σ(2 + z), z ~ N(0, 1) (about 0.9: slow forgetting), per position, shared by
    every example and head (shape ``(length, 1)``)."""
    del size, head_dim
    return {"gates": jax.nn.sigmoid(2.0 + jax.random.normal(rng, (length, 1), jnp.float32))}


def _memory_conv(rng: Array, *, size: int, length: int, head_dim: int) -> dict[str, Array]:
    """Mean pooling over each window of ``size`` positions, (size, d, d) shared by the heads:
    a deterministic stand-in for learned weights, exact softmax attention at size 1."""
    del rng, length
    pool = mean_pool_conv(size, head_dim)
    return {"key_conv": pool, "value_conv": pool}


def _log_decay(rng: Array, *, size: int | None, length: int, head_dim: int) -> dict[str, Array]:
    """GLA's log-decays logsigmoid(2 + z) per position and key dimension (decays about 0.88),
    shared by every example and head (shape ``(length, 1, head_dim)``)."""
    del size
    return {"g": jax.nn.log_sigmoid(2.0 + jax.random.normal(rng, (length, 1, head_dim)))}


def _delta(rng: Array, *, size: int | None, length: int, head_dim: int) -> dict[str, Array]:
    """DeltaNet's write strengths β = σ(z) per position, shared (shape ``(length, 1)``)."""
    del size, head_dim
    return {"beta": jax.nn.sigmoid(jax.random.normal(rng, (length, 1)))}


def _gated_delta(rng: Array, *, size: int | None, length: int,
                 head_dim: int) -> dict[str, Array]:
    """Gated DeltaNet's β = σ(z) and log-decays g = −softplus(z' − 2) (about −0.13),
    per position, shared (shape ``(length, 1)``)."""
    del size, head_dim
    z = jax.random.normal(rng, (2, length, 1))
    return {"g": -jax.nn.softplus(z[0] - 2.0), "beta": jax.nn.sigmoid(z[1])}


def _ssd(rng: Array, *, size: int | None, length: int, head_dim: int) -> dict[str, Array]:
    """Mamba-2's step sizes Δ = softplus(z − 2) per position and A = −1, shared by every
    example and head (shapes ``(length, 1)`` and ``(1,)``)."""
    del size, head_dim
    return {"dt": jax.nn.softplus(jax.random.normal(rng, (length, 1)) - 2.0),
            "A": -jnp.ones((1,), jnp.float32)}


LINFORMER_SHARING = ("none", "key_value", "layerwise")

STATE_KINDS: Mapping[str, StateKind] = MappingProxyType({
    kind.name: kind
    for kind in (
        # Performer's orthogonal random features; not trained, redrawn only explicitly.
        StateKind("random_features", ("projection",), MappingProxyType({"num_features": 256}),
                  "num_features", _random_features),
        # Linformer's learned E/F projections (Wang et al. 2020, §4 for the sharing modes).
        StateKind("length_projection", ("key_projection", "value_projection"),
                  MappingProxyType({"proj_len": 256, "sharing": "none", "max_length": None}),
                  "proj_len", _length_projection),
        # A sampling key: Skyformer's landmarks, the clustered methods' k-means start,
        # ProbSparse's key sample; absent (the deterministic choice) in evaluation.
        StateKind("landmark_rng", ("rng",), MappingProxyType({}), None, _landmark_rng),
        # Set Transformer's learned inducing points I (Lee et al. 2019, §3.2).
        StateKind("inducing_points", ("inducing_points",),
                  MappingProxyType({"num_inducing_points": 32}), "num_inducing_points",
                  _inducing_points),
        # Luna's extra sequence P: learned in the first layer, then each layer's P' (Ma et
        # al. 2021, §3); the registry entry's ``carry`` says the method returns P'.
        StateKind("packed_sequence", ("packed_query",),
                  MappingProxyType({"packed_length": 256}), "packed_length", _packed_sequence),
        # RFA-Gate's gates σ(x_t·w + b), computed from the block input (Peng et al. 2021).
        StateKind("gates", ("gates",), MappingProxyType({}), None, _gates, per_key_head=True),
        # Memory-compressed attention's learned strided convolutions W_K, W_V (Liu et al.
        # 2018, §4.2.3); kernel_size is also the default stride.
        StateKind("memory_conv", ("key_conv", "value_conv"),
                  MappingProxyType({"kernel_size": 3}), "kernel_size", _memory_conv,
                  per_key_head=True),
        # The linear-recurrent family's gates, computed from the block input by the layer
        # (spectral_jax.nn._recurrent_gates): GLA's low-rank per-dimension log-decay,
        # DeltaNet's β, Gated DeltaNet's decay and β, Mamba-2's Δ and A.
        StateKind("log_decay", ("g",), MappingProxyType(
            {"gate_low_rank_dim": 16, "gate_logit_normalizer": 16.0}), None, _log_decay,
            per_key_head=True),
        StateKind("delta", ("beta",), MappingProxyType({"allow_neg_eigval": False}), None,
                  _delta, per_key_head=True),
        StateKind("gated_delta", ("g", "beta"), MappingProxyType({"allow_neg_eigval": False}),
                  None, _gated_delta, per_key_head=True),
        StateKind("ssd", ("dt", "A"), MappingProxyType({}), None, _ssd, per_key_head=True),
    )
})
