"""The layer around a linear-recurrent core as the papers build it: a short causal convolution
on queries, keys and values, and a normalised, gated output.

:class:`MultiHeadAttention` adds these for the methods whose registry entry has a ``layer``
(the linear-recurrent family), with the module options ``short_conv_size`` (kernel size, None
for none) and ``output_gate`` (``"swish"``: RMSNorm(o) ⊙ swish(x W_g), fla's ``norm·gate``;
``"norm"``: RMSNorm(o) alone, fla's DeltaNet; None: neither). The entry's ``layer`` gives the
paper's settings, which are the defaults.

The convolution is depthwise and causal, one filter of ``short_conv_size`` taps per channel,
no bias, then SiLU (fla's ``ShortConvolution``, Mamba-2's ``conv1d``; Yang et al. 2024,
DeltaNet §4; Dao & Gu 2024, §7). Padded positions are zeroed before it, and it does not reach
across packed segments. Decoding keeps the last ``short_conv_size − 1`` valid inputs per
example.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import _checks
from spectral_jax.nn import _decode

Array = jax.Array

OUTPUT_GATES = ("swish", "norm")
_OWNER = "MultiHeadAttention"


def check_layer_options(options: dict[str, Any]) -> tuple[int | None, str | None]:
    """``(short_conv_size, output_gate)`` from the module options, checked.

    Raises:
      spectral_jax.UsageError: a non-positive kernel size or an unknown gate.
    """
    size = _checks.positive_int(_OWNER, "attention_kwargs['short_conv_size']",
                                options.get("short_conv_size"), allow_none=True)
    gate = options.get("output_gate")
    if gate is not None:
        _checks.choice(_OWNER, "attention_kwargs['output_gate']", gate, OUTPUT_GATES)
    return size, gate


def _split(x: Array, query: Array, key: Array) -> tuple[Array, Array, Array]:
    """``(..., H + 2·H_kv, d)`` back into q, k, v by their head counts."""
    h, hk = query.shape[-2], key.shape[-2]
    return x[..., :h, :], x[..., h:h + hk, :], x[..., h + hk:, :]


def convolve(layer: Any, query: Array, key: Array, value: Array, mask: Array | None,
             valid: Array | None, segment_ids: Array | None) -> tuple[Array, Array, Array]:
    """``layer.layer_parts``' short convolution: over the sequence, or (decoding, ``valid``
    given) after the inputs cached in ``layer.conv_state``, which it updates."""
    if valid is None:
        return layer.layer_parts.convolve(query, key, value, mask=mask,
                                           segment_ids=segment_ids)
    qkv, conv = layer.layer_parts.convolve_decode(_decode.get_cache(layer, "conv_state"),
                                                  query, key, value, valid)
    if conv is not None:
        _decode.set_cache(layer, conv_state=conv)
    return qkv


class RecurrentLayerParts(nnx.Module):
    """The short convolutions and the output norm and gate of one recurrent layer.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> parts = RecurrentLayerParts(4, "swish", in_features=8, num_heads=2, head_dim=3,
        ...                             rngs=nnx.Rngs(0))
        >>> q, k, v = parts.convolve(*(jnp.ones((1, 5, 2, 3)),) * 3, mask=None)
        >>> parts.finish(q, jnp.ones((1, 5, 8))).shape
        (1, 5, 2, 3)
    """

    def __init__(self, short_conv_size: int | None, output_gate: str | None, *,
                 in_features: int, num_heads: int, head_dim: int,
                 num_kv_heads: int | None = None, dtype: Any = None,
                 param_dtype: Any = jnp.float32, rngs: nnx.Rngs) -> None:
        self.size = short_conv_size
        self.gate_kind = output_gate
        # One filter per channel of q (H heads), k and v (H_kv heads each).
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        channels = (num_heads + 2 * num_kv_heads) * head_dim
        self.kernel = nnx.data(None)
        if short_conv_size is not None:
            # PyTorch's Conv1d init (uniform, fan_in = the kernel size), as fla and Mamba-2.
            init = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=0)
            self.kernel = nnx.Param(init(rngs.params(), (short_conv_size, channels),
                                         param_dtype))
        self.norm = nnx.data(None)
        self.gate = nnx.data(None)
        if output_gate is not None:
            self.norm = nnx.Param(jnp.ones((head_dim,), param_dtype))
        if output_gate == "swish":
            self.gate = nnx.LinearGeneral(in_features, (num_heads, head_dim), dtype=dtype,
                                          param_dtype=param_dtype, rngs=rngs)

    def convolve(self, query: Array, key: Array, value: Array, *, mask: Array | None,
                 segment_ids: Array | None = None) -> tuple[Array, Array, Array]:
        """SiLU(causal depthwise conv) of each of ``(batch..., n, H, d)`` q, k, v; ``mask``: a
        bool padding mask (a key some query attends to is a valid token) or None;
        ``segment_ids`` int ``(batch..., n)`` or None."""
        if self.kernel is None:
            return query, key, value
        x = jnp.concatenate([query, key, value], axis=-2)
        shape = x.shape
        x = x.reshape(*shape[:-2], -1)
        if mask is not None:
            mask = mask.reshape((1,) * (query.ndim - mask.ndim) + mask.shape)
            valid = jnp.broadcast_to(mask.any(-2).any(-2), x.shape[:-1])
            x = jnp.where(valid[..., None], x, 0.0)
        w = self.kernel[...].astype(x.dtype)
        n, taps = x.shape[-2], self.size
        out = jnp.zeros_like(x)
        for lag in range(taps):  # out_t = Σ_lag w[taps − 1 − lag] · x_{t − lag}
            shifted = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(lag, 0), (0, 0)])[..., :n, :]
            if segment_ids is not None and lag:
                ids = jnp.pad(segment_ids, [(0, 0)] * (segment_ids.ndim - 1) + [(lag, 0)],
                              constant_values=-1)[..., :n]
                shifted = jnp.where((ids == segment_ids)[..., None], shifted, 0.0)
            out = out + w[taps - 1 - lag] * shifted
        return _split(jax.nn.silu(out).reshape(shape), query, key)

    def init_cache(self, batch: tuple[int, ...], dtype: Any) -> Array | None:
        """The empty convolution cache ``(batch..., short_conv_size − 1, (H + 2·H_kv)·d)``,
        or None."""
        if self.kernel is None:
            return None
        return jnp.zeros((*batch, self.size - 1, self.kernel.shape[1]), dtype)

    def convolve_decode(self, cache: Array | None, query: Array, key: Array, value: Array,
                        valid: Array) -> tuple[tuple[Array, Array, Array], Array | None]:
        """The convolution of ``q_len`` new tokens after the cached ones, token by token;
        ``valid`` bool ``(batch..., q_len)``: a padding token neither enters the cache nor
        sees a window (its output is discarded by decoding)."""
        if self.kernel is None:
            return (query, key, value), cache
        x = jnp.concatenate([query, key, value], axis=-2)
        shape = x.shape
        x = x.reshape(*shape[:-2], -1)
        w = self.kernel[...].astype(x.dtype)
        axis = x.ndim - 2

        def step(c, token):
            xt, ok = token
            window = jnp.concatenate([c.astype(xt.dtype), xt[..., None, :]], axis=-2)
            y = jax.nn.silu(jnp.einsum("...tc,tc->...c", window, w))
            return jnp.where(ok[..., None, None], window[..., 1:, :], c), y

        cache, ys = jax.lax.scan(step, cache, (jnp.moveaxis(x, axis, 0),
                                               jnp.moveaxis(valid, -1, 0)))
        return _split(jnp.moveaxis(ys, 0, axis).reshape(shape), query, key), cache

    def finish(self, out: Array, inputs: Array) -> Array:
        """The output ``(batch..., n, H, d)`` normalised per head (RMSNorm, float32) and,
        for ``"swish"``, gated by swish(inputs W_g)."""
        if self.gate_kind is None:
            return out
        o = out.astype(jnp.float32)
        o = o * jax.lax.rsqrt(jnp.mean(o * o, -1, keepdims=True) + 1e-6)
        o = o * self.norm[...].astype(jnp.float32)
        if self.gate is not None:
            o = o * jax.nn.silu(self.gate(inputs).astype(jnp.float32))
        return o.astype(out.dtype)
