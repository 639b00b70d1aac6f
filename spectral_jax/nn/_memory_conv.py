"""Memory-compressed attention's learned convolutions, owned by the layer (Liu et al. 2018)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import _checks
from spectral_jax.attention import STATE_KINDS, mean_pool_conv
from spectral_jax.nn._rngs import stream as _stream

Array = jax.Array


class MemoryConvState(nnx.Module):
    """Learned strided-convolution weights W_K, W_V ``(num_heads, kernel_size, d, d)``.

    One filter bank per head (the paper's convolution runs over the whole model width; per
    head it is the block-diagonal part, with the same cost per slot). The weights start as
    mean pooling over each window (:func:`spectral_jax.attention.mean_pool_conv`) plus a
    small Xavier-scaled perturbation from the ``"params"`` stream, so a fresh layer attends
    to pooled keys and values at their usual scale and the heads are not identical.
    ``kernel_size`` (default 3) is also the default ``stride`` of the attention function
    (Liu et al. 2018, §4.2.3); ``stride`` can be set apart as a function parameter.

    Example:
        >>> from flax import nnx
        >>> state = MemoryConvState({"kernel_size": 3}, num_heads=2, head_dim=4,
        ...                         rngs=nnx.Rngs(0))
        >>> state.key_conv.shape, type(state.value_conv).__name__
        ((2, 3, 4, 4), 'Param')
    """

    random = False  # nothing drawn per call: `deterministic` is not needed

    def __init__(self, options: Mapping[str, Any], *, num_heads: int, head_dim: int,
                 param_dtype: Any = jnp.float32, rngs: nnx.Rngs, **_: Any) -> None:
        options = {**STATE_KINDS["memory_conv"].options, **options}
        self.kernel_size = _checks.positive_int("MultiHeadAttention",
                                                "attention_kwargs['kernel_size']",
                                                options["kernel_size"])
        shape = (num_heads, self.kernel_size, head_dim, head_dim)
        # Xavier over the conv's fan-in and fan-out (kernel·d each), scaled down: a nudge
        # off pure pooling, not a random projection that would hide the keys' structure.
        noise = nnx.initializers.variance_scaling(0.01, "fan_avg", "normal",
                                                  in_axis=(-3, -2), out_axis=-1)
        pool = mean_pool_conv(self.kernel_size, head_dim, param_dtype)
        draw = lambda: nnx.Param(  # noqa: E731
            (pool + noise(_stream(rngs, "params")(), shape, param_dtype)).astype(param_dtype))
        self.key_conv = draw()
        self.value_conv = draw()

    def __call__(self, *, kv_len: int, deterministic: bool, **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        return {"key_conv": self.key_conv[...], "value_conv": self.value_conv[...]}
