"""Memory-compressed attention's decode form: the complete memory slots and the open one.

Slot j is the strided convolution of positions js .. js + k − 1 (k the kernel, s the
stride; Liu et al. 2018, §4.2.3). A query at position t sees the slots that are complete,
js + k − 1 ≤ t (mesh-tensorflow's causal rule). The state holds the ⌊(max_length − k)/s⌋ + 1
slots that can complete within the cache and a ring buffer of the last k raw keys and
values, the open slot's inputs; a step that completes a slot convolves the ring into it.

The parallel causal form treats the end of its sequence as padding, so its last row also
sees the zero-padded tail slot when the length is not a whole number of strides; a decoder
cannot know where the sequence will end. Decoding therefore equals the parallel causal run
over any longer sequence (or the same one when its tail slot is complete) at every position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spectral_jax import UsageError
from spectral_jax.attention.compressed._memory_compressed import compress_memory
from spectral_jax.attention.core import _common
from spectral_jax.attention.core._decode_form import DecodeForm, lift_step, put, ring_prefill

Array = jax.Array
_HI = jax.lax.Precision.HIGHEST


def _geometry(params) -> tuple[int, int]:
    kernel = int(params["key_conv"].shape[-3])
    stride = kernel if params.get("stride") is None else int(params["stride"])
    return kernel, stride


def num_slots(max_length: int, kernel: int, stride: int) -> int:
    """Slots that complete within ``max_length`` tokens (at least 1, so arrays are not empty)."""
    return max(1, (max_length - kernel) // stride + 1) if max_length >= kernel else 1


def _completed(position: Array, kernel: int, stride: int) -> Array:
    """How many slots are complete once ``position`` is written."""
    return jnp.where(position >= kernel - 1, (position - kernel + 1) // stride + 1, 0)


def _init(batch, heads, head_dim, v_head_dim, max_length, dtype, params):
    kernel, stride = _geometry(params)
    m = num_slots(max_length, kernel, stride)
    ct = _common.compute_dtype(dtype)
    return {"memory_key": jnp.zeros((batch, heads, m, head_dim), ct),
            "memory_value": jnp.zeros((batch, heads, m, v_head_dim), ct),
            "key": jnp.zeros((batch, heads, kernel, head_dim), dtype),
            "value": jnp.zeros((batch, heads, kernel, v_head_dim), dtype)}


def _prefill(q, k, v, lengths, max_length, params):
    del q
    kernel, stride = _geometry(params)
    m = num_slots(max_length, kernel, stride)
    valid = jnp.arange(k.shape[1])[None, None, :] < lengths[:, None, None]
    valid = jnp.broadcast_to(valid, (k.shape[0], k.shape[2], k.shape[1]))
    memory_k, _ = compress_memory(k, valid, params["key_conv"], stride)  # (B, m_p, H, d)
    memory_v, _ = compress_memory(v, valid, params["value_conv"], stride)
    done = jnp.arange(memory_k.shape[1])[None, :] < _completed(lengths - 1, kernel, stride)[:, None]

    def slots(x: Array) -> Array:
        x = jnp.swapaxes(jnp.where(done[:, :, None, None], x, 0.0), 1, 2)[:, :, :m]
        return jnp.pad(x, ((0, 0), (0, 0), (0, m - x.shape[2]), (0, 0)))

    return {"memory_key": slots(memory_k), "memory_value": slots(memory_v),
            "key": ring_prefill(k, lengths, kernel).astype(k.dtype),
            "value": ring_prefill(v, lengths, kernel).astype(v.dtype)}


def _outputs(q, k, v, lengths, params):
    """Prefill outputs: query i attends to the slots with js + k − 1 ≤ i."""
    kernel, stride = _geometry(params)
    scale = _common.default_scale("prefill", params.get("scale"), q.shape[-1])
    valid = jnp.arange(k.shape[1])[None, None, :] < lengths[:, None, None]
    valid = jnp.broadcast_to(valid, (k.shape[0], k.shape[2], k.shape[1]))
    memory_k, _ = compress_memory(k, valid, params["key_conv"], stride)
    memory_v, _ = compress_memory(v, valid, params["value_conv"], stride)
    ct = memory_k.dtype
    last = stride * jnp.arange(memory_k.shape[1]) + kernel - 1  # each slot's last position
    allowed = last[None, :] <= jnp.arange(q.shape[1])[:, None]  # (P, m)
    b, p, heads = q.shape[:3]
    # Grouped-query heads: G queries read each key/value head's slots.
    q = q.reshape(b, p, k.shape[2], heads // k.shape[2], q.shape[-1])
    logits = jnp.einsum("bqhgd,bmhd->bhgqm", q.astype(ct) * scale, memory_k, precision=_HI)
    weights = _common.masked_softmax(logits, allowed)
    out = jnp.einsum("bhgqm,bmhe->bqhge", weights, memory_v, precision=_HI)
    out = out.reshape(b, p, heads, out.shape[-1])
    q_valid = jnp.arange(p)[None, :] < lengths[:, None]
    return jnp.where(q_valid[:, :, None, None], out, 0.0)


def _conv_per_head(conv: Array, batch: int, heads: int) -> Array:
    """``(B, H, kernel, d, d_out)`` from weights shared by the heads or given per head."""
    conv = conv if conv.ndim == 4 else jnp.broadcast_to(conv, (heads, *conv.shape))
    return jnp.broadcast_to(conv, (batch, *conv.shape))


def _step(arrays, position, write, q, k, v, params):
    kernel, stride = _geometry(params)
    if arrays["key"].shape[-2] != kernel:
        raise UsageError(
            f"decode_step(): the memory-compressed state was built for kernel size "
            f"{arrays['key'].shape[-2]}, but key_conv has kernel size {kernel}.")
    scale = _common.default_scale("decode_step", params.get("scale"), q.shape[-1])
    b, h = k.shape[:2]
    convs = {"key": _conv_per_head(params["key_conv"], b, h),
             "value": _conv_per_head(params["value_conv"], b, h)}

    def core(s, pos, write1, q1, k1, v1, conv):
        ct = s["memory_key"].dtype
        slot = pos % kernel
        ring = {name: put(s[name], slot, x, write1) for name, x in (("key", k1), ("value", v1))}
        # The ring in position order pos − k + 1 .. pos (its oldest slot first).
        order = (pos - kernel + 1 + jnp.arange(kernel)) % kernel
        complete = (pos >= kernel - 1) & ((pos - kernel + 1) % stride == 0)
        index = jnp.clip((pos - kernel + 1) // stride, 0, s["memory_key"].shape[0] - 1)
        memory = {}
        for name in ("key", "value"):
            new = jnp.einsum("td,tde->e", ring[name][order].astype(ct), conv[name].astype(ct),
                             precision=_HI)
            memory[name] = put(s["memory_" + name], index, new, complete & write1)
        seen = jnp.arange(memory["key"].shape[0]) < _completed(pos, kernel, stride)
        logits = memory["key"] @ (q1.astype(ct) * scale)
        out = _common.masked_softmax(logits, seen) @ memory["value"]
        return out, {"memory_key": memory["key"], "memory_value": memory["value"], **ring}

    return lift_step(core, arrays, position, write, q, k, v, convs)


COMPRESSED_MEMORY = DecodeForm(
    init=_init, prefill=_prefill, step=_step, outputs=_outputs,
    summary="the complete memory slots (max_length/stride) and a ring buffer of the last "
            "kernel keys and values: O((max_length/stride)·d) per head",
    grouped=True)
