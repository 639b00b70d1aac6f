"""Learned method state that lives in the model's feature space: inducing points, Luna's
packed sequence and RFA-Gate's gates.

Each module is built from its kind's options (``spectral_jax.attention.STATE_KINDS``) and
the layer's sizes, and returns the keyword arguments it contributes to the attention
function, as every module of :data:`~spectral_jax.nn.STATE_MODULES` does. Besides ``kv_len``
and ``deterministic`` the call receives ``inputs`` (the block input the keys and values are
projected from) and ``carry`` (the previous layer's carried state, Luna's P); modules that need
neither ignore them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UsageError, _checks
from spectral_jax.attention import STATE_KINDS
from spectral_jax.nn._embedding import sinusoidal_positions

Array = jax.Array


class InducingPointState(nnx.Module):
    """The Set Transformer's m learned inducing points, ``nnx.Param`` ``(m, heads, head_dim)``.

    Xavier-uniform over (m, heads·head_dim), as the reference code's
    ``nn.init.xavier_uniform_`` on its ``(1, m, dim)`` tensor up to the fan convention
    (Lee et al. 2019, §3.2; juho-lee/set_transformer ``modules.py``).

    Projections: the points live directly in the per-head query space, so the first MAB's
    query projection I·W_q is folded into them (a learned matrix times a learned matrix).
    :class:`~spectral_jax.nn.MultiHeadAttention` then applies its usual projections once,
    Q = X·W_q, K = X·W_k, V = X·W_v, computes H = softmax(I Kᵀ/√d) V and
    out = softmax(Q Hᵀ/√d) H, and the output projection W_o. Unlike the paper's ISAB there
    are no separate key/value projections of H in the second step, no residuals, layer norms
    or rFF inside the attention (the encoder block adds its own residual, norm and MLP).

    Example:
        >>> from flax import nnx
        >>> InducingPointState({"num_inducing_points": 4}, num_heads=2, head_dim=8,
        ...     rngs=nnx.Rngs(0)).points.shape
        (4, 2, 8)
    """

    random = False  # nothing drawn per call: `deterministic` is not needed

    def __init__(self, options: Mapping[str, Any], *, num_heads: int, head_dim: int,
                 param_dtype: Any = jnp.float32, rngs: nnx.Rngs, **_: Any) -> None:
        options = {**STATE_KINDS["inducing_points"].options, **options}
        size = _checks.positive_int("MultiHeadAttention", "attention_kwargs['num_inducing_points']",
                                    options["num_inducing_points"])
        init = nnx.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))
        self.points = nnx.Param(init(rngs.params(), (size, num_heads, head_dim), param_dtype))

    def __call__(self, *, kv_len: int, deterministic: bool, **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        return {"inducing_points": self.points[...]}


class PackedSequenceState(nnx.Module):
    """Luna's extra sequence P ``(l, in_features)`` and its projections (Ma et al. 2021, §3).

    The first layer's P is a learned ``nnx.Param`` (normal, std in_features^-½) plus the
    sinusoidal position table, as fairseq-apollo's ``LunaSentenceEncoder`` (projected
    embeddings + projected positions); a later layer gets the previous layer's output P as
    ``carry`` instead (``TransformerEncoder`` passes it on).

    Projections applied here: P is layer-normed and projected to the heads by its own query
    projection W_pq (``packed_query`` of the pure function); the pack step reads the layer's
    keys and values K = X·W_k, V = X·W_v (not tied, unlike the reference's ``tie_kv``); the
    packed heads P' go back to the feature space through their own output projection W_po,
    and the next layer's P is P + P'·W_po (a pre-norm residual, as the block does for X).
    The unpack step reads P' as keys and values without further projections.

    Example:
        >>> from flax import nnx
        >>> state = PackedSequenceState({"packed_length": 4}, in_features=8, num_heads=2,
        ...     head_dim=4, rngs=nnx.Rngs(0))
        >>> state(kv_len=16, deterministic=True)["packed_query"].shape
        (4, 2, 4)
    """

    random = False  # nothing drawn per call: `deterministic` is not needed

    def __init__(self, options: Mapping[str, Any], *, in_features: int, num_heads: int,
                 head_dim: int, dtype: Any = None, param_dtype: Any = jnp.float32,
                 rngs: nnx.Rngs, **_: Any) -> None:
        options = {**STATE_KINDS["packed_sequence"].options, **options}
        self.packed_length = _checks.positive_int(
            "MultiHeadAttention", "attention_kwargs['packed_length']", options["packed_length"])
        self.in_features = in_features
        init = nnx.initializers.normal(in_features**-0.5)
        self.packed = nnx.Param(init(rngs.params(), (self.packed_length, in_features),
                                     param_dtype))
        common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = nnx.LayerNorm(in_features, **common)
        self.query = nnx.LinearGeneral(in_features, (num_heads, head_dim), **common)
        self.out = nnx.LinearGeneral((num_heads, head_dim), in_features, axis=(-2, -1),
                                     **common)

    def sequence(self, carry: Array | None) -> Array:
        """P: ``carry`` (batch..., l, in_features) when given, else the learned first P."""
        if carry is None:
            positions = sinusoidal_positions(self.packed_length, self.in_features)
            return self.packed[...] + jnp.asarray(positions, self.packed.dtype)
        if carry.shape[-2:] != (self.packed_length, self.in_features):
            raise UsageError(
                f"Luna carry must have shape (batch..., packed_length={self.packed_length}, "
                f"in_features={self.in_features}); got {carry.shape}."
            )
        return carry

    def __call__(self, *, kv_len: int, deterministic: bool, carry: Array | None = None,
                 **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        return {"packed_query": self.query(self.norm(self.sequence(carry)))}

    def next_carry(self, packed: Array, carry: Array | None) -> Array:
        """The next layer's P = P + P'·W_po, ``(batch..., l, in_features)``."""
        return self.sequence(carry) + self.out(packed)


class GateState(nnx.Module):
    """RFA-Gate's gates g_t = σ(x_t·w + b) per token and head (Peng et al. 2021, §3.2).

    One ``nnx.Linear(in_features, num_heads)`` on the block input the keys are projected
    from (``inputs`` of the call), then a sigmoid in float32. The bias starts at 2 (g ≈ 0.88,
    about 8 tokens of memory); at 0 every gate would start at ½ and forget within 2 tokens.
    No other projection: queries, keys and values are the layer's usual ones.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> state = GateState({}, in_features=8, num_heads=2, rngs=nnx.Rngs(0))
        >>> state(kv_len=5, deterministic=True, inputs=jnp.ones((1, 5, 8)))["gates"].shape
        (1, 5, 2)
    """

    random = False  # nothing drawn per call: `deterministic` is not needed

    def __init__(self, options: Mapping[str, Any], *, in_features: int, num_heads: int,
                 dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs,
                 **_: Any) -> None:
        del options
        self.gate = nnx.Linear(in_features, num_heads, bias_init=nnx.initializers.constant(2.0),
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, *, kv_len: int, deterministic: bool, inputs: Array | None = None,
                 **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        if inputs is None:
            raise UsageError("gated_linear's gates are computed from the block input: pass "
                             "inputs= to the state module (MultiHeadAttention does).")
        return {"gates": jax.nn.sigmoid(self.gate(inputs).astype(jnp.float32))}
