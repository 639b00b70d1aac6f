"""The gates of the linear-recurrent family, computed from the block input as the papers do.

Each module is the state module of one kind in ``spectral_jax.attention.STATE_KINDS`` (see
:mod:`spectral_jax.nn._state`): called with the block input (``inputs``, the tokens the keys
are projected from), it returns the gate arguments of the attention function, in float32.
Parameters that the papers keep out of weight decay (``A_log``, ``dt_bias``) are
``nnx.Param`` like the rest; an optimiser mask can single them out by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UsageError, _checks

Array = jax.Array

_OWNER = "MultiHeadAttention"


def _inputs(kind: str, inputs: Array | None) -> Array:
    if inputs is None:
        raise UsageError(f"the {kind!r} gates are computed from the block input: pass inputs= "
                         "to the state module (MultiHeadAttention does).")
    return inputs


def _dt_bias_init(rngs: nnx.Rngs, num_heads: int) -> Array:
    """Mamba-2's init: Δ ~ log-uniform[1e-3, 0.1] (floored at 1e-4), stored as softplus⁻¹(Δ)."""
    u = jax.random.uniform(rngs.params(), (num_heads,))
    dt = jnp.maximum(jnp.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)), 1e-4)
    return dt + jnp.log(-jnp.expm1(-dt))


def _a_log_init(rngs: nnx.Rngs, num_heads: int) -> Array:
    """A_log = log U(1, 16) (Mamba-2, Gated DeltaNet)."""
    return jnp.log(jax.random.uniform(rngs.params(), (num_heads,), minval=1.0, maxval=16.0))


class LogDecayGate(nnx.Module):
    """GLA's per-key-dimension gate g = logsigmoid(x W₁ W₂ + b) / τ (Yang et al. 2024, §4.4).

    A low-rank projection (``gate_low_rank_dim``, no bias, then one with bias) to
    ``(num_heads, head_dim)``, a log-sigmoid and the ``gate_logit_normalizer`` τ (16 in
    fla's GLA layer), which keeps most decays near 1.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> gate = LogDecayGate({"gate_low_rank_dim": 4, "gate_logit_normalizer": 16},
        ...     in_features=8, num_heads=2, head_dim=3, rngs=nnx.Rngs(0))
        >>> gate(kv_len=5, deterministic=True, inputs=jnp.ones((1, 5, 8)))["g"].shape
        (1, 5, 2, 3)
    """

    random = False

    def __init__(self, options: Mapping[str, Any], *, in_features: int, num_heads: int,
                 head_dim: int, dtype: Any = None, param_dtype: Any = jnp.float32,
                 rngs: nnx.Rngs, **_: Any) -> None:
        rank = _checks.positive_int(_OWNER, "attention_kwargs['gate_low_rank_dim']",
                                    options["gate_low_rank_dim"])
        self.normalizer = _checks.number(_OWNER, "attention_kwargs['gate_logit_normalizer']",
                                         options["gate_logit_normalizer"], low=1e-6,
                                         what="a positive float")
        common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.down = nnx.Linear(in_features, rank, use_bias=False, **common)
        self.up = nnx.LinearGeneral(rank, (num_heads, head_dim), **common)

    def __call__(self, *, kv_len: int, deterministic: bool, inputs: Array | None = None,
                 **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        x = self.up(self.down(_inputs("log_decay", inputs))).astype(jnp.float32)
        return {"g": jax.nn.log_sigmoid(x) / self.normalizer}


class DeltaGate(nnx.Module):
    """DeltaNet's write strength β = σ(x w + b) per head (×2 with ``allow_neg_eigval``).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> gate = DeltaGate({"allow_neg_eigval": False}, in_features=8, num_heads=2,
        ...                  rngs=nnx.Rngs(0))
        >>> gate(kv_len=5, deterministic=True, inputs=jnp.ones((1, 5, 8)))["beta"].shape
        (1, 5, 2)
    """

    random = False

    def __init__(self, options: Mapping[str, Any], *, in_features: int, num_heads: int,
                 dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs,
                 **_: Any) -> None:
        self.factor = 2.0 if _checks.boolean(_OWNER, "attention_kwargs['allow_neg_eigval']",
                                             options["allow_neg_eigval"]) else 1.0
        self.beta = nnx.Linear(in_features, num_heads, dtype=dtype, param_dtype=param_dtype,
                               rngs=rngs)

    def __call__(self, *, kv_len: int, deterministic: bool, inputs: Array | None = None,
                 **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        x = self.beta(_inputs("delta", inputs)).astype(jnp.float32)
        return {"beta": self.factor * jax.nn.sigmoid(x)}


class GatedDeltaGate(DeltaGate):
    """Gated DeltaNet's gates: β as :class:`DeltaGate` and the log-decay
    g = −exp(A_log)·softplus(x w_a + dt_bias) (Yang et al. 2025, §3.3; fla's layer).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> gate = GatedDeltaGate({"allow_neg_eigval": False}, in_features=8, num_heads=2,
        ...                       rngs=nnx.Rngs(0))
        >>> out = gate(kv_len=5, deterministic=True, inputs=jnp.ones((1, 5, 8)))
        >>> out["g"].shape, bool((out["g"] <= 0).all())
        ((1, 5, 2), True)
    """

    def __init__(self, options: Mapping[str, Any], *, in_features: int, num_heads: int,
                 dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs,
                 **_: Any) -> None:
        super().__init__(options, in_features=in_features, num_heads=num_heads, dtype=dtype,
                         param_dtype=param_dtype, rngs=rngs)
        self.decay = nnx.Linear(in_features, num_heads, use_bias=False, dtype=dtype,
                                param_dtype=param_dtype, rngs=rngs)
        self.A_log = nnx.Param(_a_log_init(rngs, num_heads).astype(param_dtype))
        self.dt_bias = nnx.Param(_dt_bias_init(rngs, num_heads).astype(param_dtype))

    def __call__(self, *, kv_len: int, deterministic: bool, inputs: Array | None = None,
                 **_: Any) -> dict[str, Array]:
        out = super().__call__(kv_len=kv_len, deterministic=deterministic, inputs=inputs)
        a = self.decay(inputs).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        out["g"] = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
        return out


class SSDGate(nnx.Module):
    """Mamba-2's step size Δ = softplus(x w + dt_bias) and A = −exp(A_log) per head
    (Dao & Gu 2024; ``mamba_ssm/modules/mamba2.py``'s initialisation).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> gate = SSDGate({}, in_features=8, num_heads=2, rngs=nnx.Rngs(0))
        >>> out = gate(kv_len=5, deterministic=True, inputs=jnp.ones((1, 5, 8)))
        >>> out["dt"].shape, out["A"].shape
        ((1, 5, 2), (2,))
    """

    random = False

    def __init__(self, options: Mapping[str, Any], *, in_features: int, num_heads: int,
                 dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs,
                 **_: Any) -> None:
        del options
        self.dt = nnx.Linear(in_features, num_heads, use_bias=False, dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)
        self.A_log = nnx.Param(_a_log_init(rngs, num_heads).astype(param_dtype))
        self.dt_bias = nnx.Param(_dt_bias_init(rngs, num_heads).astype(param_dtype))

    def __call__(self, *, kv_len: int, deterministic: bool, inputs: Array | None = None,
                 **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        x = self.dt(_inputs("ssd", inputs)).astype(jnp.float32)
        return {"dt": jax.nn.softplus(x + self.dt_bias[...].astype(jnp.float32)),
                "A": -jnp.exp(self.A_log[...].astype(jnp.float32))}
