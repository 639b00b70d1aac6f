"""The one driver behind every linear-recurrent method: checks, grouped heads, segments,
padding, the sequence-parallel prefix, and the lift of the chunked core over batch and heads.

Heads: query ``H_q``, key ``H_k`` and value ``H_v`` heads. The state lives per value head
(``H_s = H_v``, with ``H_v`` a multiple of ``H_k``: grouped values, as fla's Gated DeltaNet);
each state head is read by ``H_q / H_v`` query heads (grouped queries, ``H_q`` a multiple of
``H_v``) or shares one query head with ``H_v / H_q`` others (grouped values, ``H_q = H_k``).
Key head ``j // (H_v / H_k)`` and, with grouped values, query head ``j // (H_v / H_q)`` serve
value head j (fla's and Mamba-2's blocked mapping). Outputs have ``max(H_q, H_v)`` heads.
Gates and write strengths are per state head. States are computed once per state head and
never repeated over its query group.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectral_jax import UnsupportedError, UsageError, UsageTypeError, _checks
from spectral_jax.attention.core import _common, _segments, _seq
from spectral_jax.attention.core._prologue import prologue
from spectral_jax.attention.recurrent import _chunk

Array = jax.Array


class Heads(NamedTuple):
    """The head layout of one call (see the module docstring)."""

    query: int
    key: int
    value: int

    @property
    def state(self) -> int:
        return self.value

    @property
    def out(self) -> int:
        return max(self.query, self.value)

    @property
    def group(self) -> int:
        """Query heads per state head (1 with grouped values)."""
        return max(1, self.query // self.value)


def check_call(method: str, query: Array, key: Array, value: Array, bias: Array | None,
               mask: Array | None, is_causal: Any, flax_kwargs: dict[str, Any]) -> Heads:
    """The checks every method of the family starts with, in the library's order: Flax's
    keywords, Flax's decode call, the layout (grouped heads allowed), bias, causality.

    Raises:
      spectral_jax.UsageError: ranks, batch dims or lengths differ, an empty sequence, head
        counts that do not group (module docstring), query and key head_dim differ, a bias.
      spectral_jax.UnsupportedError: ``is_causal=False``; Flax's decode call (one query
        against a cache: use ``decode_step``, which carries the state).
      spectral_jax.UsageTypeError: non-float inputs, unknown keywords, a non-bool is_causal.
    """
    _common.check_flax_kwargs(method, flax_kwargs)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "ndim") or x.ndim < 3:
            raise UsageError(f"{method}(): `{name}` must have shape (batch..., length, heads, "
                             f"head_dim); got {getattr(x, 'shape', type(x))}.")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise UsageTypeError(f"{method}(): `{name}` must be a floating array; got dtype "
                                 f"{x.dtype}.")
    _common.reject_cache_query(method, query, key, mask)
    if query.shape[-3] == 0 or key.shape[-3] == 0:
        raise UsageError(f"{method}(): sequence lengths must be >= 1; got q_len="
                         f"{query.shape[-3]}, kv_len={key.shape[-3]}.")
    if not (query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
        raise UsageError(
            f"{method}(): query, key and value must share (batch..., length): the recurrence "
            f"reads one key per query; got shapes {query.shape}, {key.shape}, {value.shape}. "
            "To decode token by token use spectral_jax.attention.decode_step, which carries "
            "the state.")
    if query.shape[-1] != key.shape[-1]:
        raise UsageError(f"{method}(): query and key head_dim differ: {query.shape[-1]} vs "
                         f"{key.shape[-1]}.")
    heads = Heads(query.shape[-2], key.shape[-2], value.shape[-2])
    grouped_queries = heads.query % heads.value == 0
    grouped_values = heads.value % heads.query == 0 and heads.query == heads.key
    if heads.value % heads.key or not (grouped_queries or grouped_values):
        raise UsageError(
            f"{method}(): heads must group: value heads a multiple of key heads, and query "
            f"heads a multiple of value heads (grouped queries) or equal to the key heads with "
            f"value heads a multiple of them (grouped values); got query {heads.query}, key "
            f"{heads.key}, value {heads.value}.")
    _common.reject_bias(method, bias)
    _checks.boolean(f"{method}()", "is_causal", is_causal)
    if not is_causal:
        raise UnsupportedError(
            f"{method}(): `is_causal=False` is not supported: the recurrence only looks back, "
            "so it is causal by construction. Pass is_causal=True (the default).")
    return heads


def per_state(method: str, name: str, x: Any, batch_shape: tuple[int, ...], n: int,
              heads: int, trailing: tuple[int, ...] = ()) -> Array:
    """A per-token, per-state-head array ``(batch..., n, heads, *trailing)``, broadcast from
    any shape whose batch and head dims may be 1 (the length must be n).

    Raises:
      spectral_jax.UsageError: another shape. spectral_jax.UsageTypeError: not floating.
    """
    expected = (*batch_shape, n, heads, *trailing)
    shape = tuple(getattr(x, "shape", ()))
    ok = (hasattr(x, "shape") and len(shape) <= len(expected)
          and len(shape) >= 2 + len(trailing)
          and shape[len(shape) - len(trailing) - 2] == n
          and all(s in (1, e) for s, e in zip(shape[::-1], expected[::-1])))
    if not ok:
        raise UsageError(
            f"{method}(): `{name}` must have shape (batch..., length, heads"
            f"{', ' + ', '.join(map(str, trailing)) if trailing else ''}) = {expected} "
            f"(batch and heads may be 1); got {shape if hasattr(x, 'shape') else type(x)}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise UsageTypeError(f"{method}(): `{name}` must be a floating array; got dtype "
                             f"{x.dtype}.")
    return jnp.broadcast_to(x, expected)


def check_range(method: str, name: str, x: Array, low: float, high: float, what: str) -> None:
    """Raises a UsageError naming ``name`` when concrete values fall outside [low, high]."""
    if isinstance(x, jax.core.Tracer):
        return
    values = np.asarray(x, np.float64)
    bad = values[~((values >= low) & (values <= high))]
    if bad.size:
        raise UsageError(f"{method}(): `{name}` must lie in [{low}, {high}] ({what}); got "
                         f"values such as {bad[:3].tolist()}.")


def resets(method: str, segment_ids: Any, batch_shape: tuple[int, ...], n: int) -> Array:
    """bool ``(B, n)``: True where a token starts a new packed segment (not the first token).

    Raises:
      spectral_jax.UsageError: ``segment_ids`` not an int array of shape (batch..., n).
    """
    b = math.prod(batch_shape)
    if segment_ids is None:
        return jnp.zeros((b, n), bool)
    if (not hasattr(segment_ids, "shape") or tuple(segment_ids.shape) != (*batch_shape, n)
            or not jnp.issubdtype(segment_ids.dtype, jnp.integer)):
        shards = _seq.num_shards()
        where = f" (this shard's {n} of {n * shards} tokens)" if shards > 1 else ""
        raise UsageError(
            f"{method}(): `segment_ids` must be an int array of shape (batch..., length) = "
            f"{(*batch_shape, n * shards)}; got {getattr(segment_ids, 'dtype', type(segment_ids))}"
            f" {getattr(segment_ids, 'shape', '')}{where}.")
    ids = segment_ids.reshape(b, n)
    # On a split sequence the first token compares with the previous shard's last one.
    before = _seq.from_previous(ids[:, -1:])
    first = jnp.where(_seq.offset(n) == 0, ids[:, :1], before)
    return jnp.concatenate([first, ids[:, :-1]], axis=1) != ids


# The parameters every public function of the family passes through to :func:`run` as given.
PASSED = ("scale", "is_causal", "chunk_size", "segment_ids", "initial_state",
          "return_final_state", "query_seq_lengths", "key_value_seq_lengths", "head_chunk_size")


def passed(arguments: dict[str, Any]) -> dict[str, Any]:
    """The :data:`PASSED` entries of a public function's ``locals()``."""
    return {name: arguments[name] for name in PASSED}


class Call(NamedTuple):
    """One call's flattened, per-state-head operands, batch dims flattened to B."""

    q: Array        # (B, H_s, G, n, d_k)
    k: Array        # (B, H_s, n, d_k)
    v: Array        # (B, H_s, n, d_v)
    g: Array        # (B, H_s, n, K)
    beta: Array | None  # (B, H_s, n)
    reset: Array    # (B, n)
    query_valid: Array  # (B, H_out, n)


def run(method: str, query: Array, key: Array, value: Array, mask: Array | None, *,
        g: Array, beta: Array | None, scale: Any, segment_ids: Any, chunk_size: int,
        is_causal: bool, query_seq_lengths: Any, key_value_seq_lengths: Any,
        initial_state: Array | None, return_final_state: bool, qk_l2norm: bool,
        flax_kwargs: dict[str, Any], head_chunk_size: int | None = None,
        default_scale: float | None = None, skip: Array | None = None) -> Any:
    """Prepares and runs one call of a linear-recurrent method (after :func:`check_call`).

    ``g`` is ``(batch..., n, H_v, K)`` (K = 1 or d_k) and ``beta`` ``(batch..., n, H_v)`` or
    None, both already broadcast and range-checked by the method. Returns the output
    ``(batch..., n, max(H_q, H_v), d_v)`` in query's dtype, and with
    ``return_final_state`` the float32 (or wider) final state ``(batch..., H_v, d_k, d_v)``.
    ``skip``: ``(batch..., n, H_v, d_v)`` added to valid outputs (Mamba-2's D·x).
    """
    del is_causal, flax_kwargs  # checked by check_call
    _checks.positive_int(f"{method}()", "chunk_size", chunk_size)
    _checks.boolean(f"{method}()", "return_final_state", return_final_state)
    _checks.boolean(f"{method}()", "qk_l2norm", qk_l2norm)
    heads = Heads(query.shape[-2], key.shape[-2], value.shape[-2])
    batch_shape, n = query.shape[:-3], query.shape[-3]
    b, d_k, d_v = math.prod(batch_shape), key.shape[-1], value.shape[-1]
    if default_scale is not None and scale is None:
        scale = default_scale
    p = prologue(method, query, query, mask, scale, query_seq_lengths=query_seq_lengths,
                 key_value_seq_lengths=key_value_seq_lengths,
                 is_causal=True)
    ct = _common.compute_dtype(query.dtype)
    state0 = jnp.zeros((b, heads.state, d_k, d_v), ct)
    if initial_state is not None:
        expected = (*batch_shape, heads.state, d_k, d_v)
        if getattr(initial_state, "shape", None) != expected:
            raise UsageError(f"{method}(): `initial_state` must have shape (batch..., heads, "
                             f"d_k, d_v) = {expected}; got "
                             f"{getattr(initial_state, 'shape', type(initial_state))}.")
        state0 = initial_state.reshape(state0.shape).astype(ct)
    q, k, v = (x.reshape(b, n, *x.shape[-2:]).astype(ct) for x in (query, key, value))
    if qk_l2norm:
        q, k = (x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6) for x in (q, k))
    # The key-valid mask of each state head: that of a query head reading it.
    reader = (jnp.arange(heads.state) * heads.query) // heads.state
    key_valid = p.key_valid[:, reader]  # (B, H_s, n)
    k = jnp.repeat(k, heads.state // heads.key, axis=2) if heads.key != heads.state else k
    if heads.query >= heads.state:
        q = q.reshape(b, n, heads.state, heads.group, d_k)
        query_valid = p.query_valid
    else:
        q = jnp.repeat(q, heads.state // heads.query, axis=2)[:, :, :, None]
        query_valid = jnp.repeat(p.query_valid, heads.state // heads.query, axis=1)
    # A padded token is the identity: it neither writes nor decays the state.
    kv = key_valid[..., None]
    k = jnp.where(kv, jnp.swapaxes(k, 1, 2), 0.0)
    v = jnp.where(kv, jnp.swapaxes(v, 1, 2), 0.0)
    g = jnp.where(kv, jnp.moveaxis(g.reshape(b, n, heads.state, -1).astype(ct), 1, 2), 0.0)
    if beta is not None:
        beta = jnp.where(key_valid, jnp.swapaxes(beta.reshape(b, n, heads.state), 1, 2)
                         .astype(ct), 0.0)
    reset = resets(method, segment_ids, batch_shape, n)
    mask_ok = p.mask_ok
    if segment_ids is not None and _seq.active() is None:
        ids = segment_ids.reshape(b, n)  # kept concrete where it was, for the check
        mask_ok = _segments.with_runs_checked(method, _segments.Segments(ids, ids), mask_ok)
    call = Call(jnp.moveaxis(q, 1, 3), k, v, g, beta, reset, query_valid)
    chunk = _common.resolve_head_chunk_size(method, head_chunk_size, b * heads.state, n)
    lift = _lift if _seq.active() is not None else _compiled_lift
    out, final = lift(call, state0, scale=p.scale, chunk_size=chunk_size, head_chunk=chunk)
    if skip is not None:
        skip = jnp.repeat(skip.reshape(b, n, heads.state, d_v), heads.out // heads.state, 2)
        out = out + jnp.swapaxes(skip, 1, 2)
    out = jnp.where(call.query_valid[..., None], out, 0.0)  # (B, H_out, n, d_v)
    out = _common.poison_invalid(jnp.swapaxes(out, 1, 2).reshape(
        *batch_shape, n, heads.out, d_v), mask_ok).astype(query.dtype)
    if return_final_state:
        return out, final.reshape(*batch_shape, heads.state, d_k, d_v)
    return out


@functools.partial(jax.jit, static_argnames=("chunk_size", "head_chunk"))
def _compiled_lift(call: Call, state0: Array, *, scale: Any, chunk_size: int,
                   head_chunk: int) -> tuple[Array, Array]:
    """:func:`_lift` as one program: an eager call (a notebook's) compiles it once per shape
    instead of dispatching the chunked form's hundreds of operations one by one (7.6 s → 2.6 s
    for the first DeltaNet call at n = 100, checks included); inside an outer ``jit`` it is
    inlined. A split sequence (traced inside ``shard_map`` already) calls :func:`_lift`."""
    return _lift(call, state0, scale=scale, chunk_size=chunk_size, head_chunk=head_chunk)


def _lift(call: Call, state0: Array, *, scale: Any, chunk_size: int,
          head_chunk: int) -> tuple[Array, Array]:
    """The chunked core over batch and state heads: ``(B, H_out, n, d_v)`` and the final
    states ``(B, H_s, d_k, d_v)``. ``head_chunk`` (example, state head) slices run at once;
    fewer than all run by ``jax.lax.map``, each step rematerialised in the backward pass."""
    def head(q, k, v, g, beta, reset, s0):
        chunks, n = _chunk.chunk_quantities(q, k, v, g, beta, reset, scale=scale,
                                            chunk_size=chunk_size)
        if _seq.active() is not None:
            s0 = _entering_state(chunks, s0)
        out, final = _chunk.run_chunks(chunks, s0)
        return out[:, :n], final

    b, h_s = call.k.shape[:2]
    reset = jnp.broadcast_to(call.reset[:, None], (b, h_s, call.reset.shape[-1]))
    operands = (call.q, call.k, call.v, call.g, call.beta, reset, state0)
    if head_chunk >= b * h_s:
        out, final = jax.vmap(jax.vmap(head))(*operands)
    else:
        flat = jax.tree.map(lambda x: x.reshape(b * h_s, *x.shape[2:]), operands)
        out, final = jax.lax.map(jax.checkpoint(lambda xs: head(*xs)), flat,
                                 batch_size=head_chunk if head_chunk > 1 else None)
        out, final = (x.reshape(b, h_s, *x.shape[1:]) for x in (out, final))
    g_q = out.shape[2]
    return out.reshape(b, h_s * g_q, *out.shape[3:]), final


def _entering_state(chunks: _chunk.Chunks, s0: Array) -> Array:
    """The state entering this shard of a split sequence (LASP-2's prefix, with gates and
    the delta rule): each shard maps an entering state S to M S + S_ext; one all-gather of
    every shard's (M, S_ext), then a fold over the shards before this one. Traffic per head:
    P·(d_k·d_v + size(M)), M a d_k (or 1) vector, or d_k × d_k for the delta rule."""
    shard = _seq.active()
    # Scan carries start as values that vary over the shards, as the chunks they meet do.
    d_k = chunks.k_out.shape[-1]
    axes = (shard.axis_name,) + ((shard.batch_axis,) if shard.batch_axis else ())
    varying = lambda x: jax.lax.pcast(x, axes, to="varying")  # noqa: E731
    summary = (_chunk.transition(chunks, varying(jnp.eye(d_k, dtype=s0.dtype))),
               _chunk.leaving_state(chunks, varying(jnp.zeros(s0.shape, s0.dtype))))
    every = jax.lax.all_gather(summary, shard.axis_name)
    index = jax.lax.axis_index(shard.axis_name)
    state = s0
    for j in range(shard.num_shards):
        m_j, s_j = (x[j] for x in every)
        state = jnp.where(j < index, _chunk.apply_transition(m_j, state) + s_j, state)
    return state
