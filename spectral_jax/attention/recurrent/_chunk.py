"""The chunked form of every linear-recurrent method, for one state head.

One recurrence covers the family. Per token t, with a log-decay g_t ≤ 0 (a scalar, or one
per key dimension) and, for the delta rule, a write strength β_t:

    additive (GLA, simple GLA, RetNet, Mamba-2 SSD):  S_t = Diag(e^{g_t}) S_{t−1} + k_t v_tᵀ
    delta rule (DeltaNet, Gated DeltaNet, KDA):      S' = Diag(e^{g_t}) S_{t−1},
                                                      S_t = S' + β_t k_t (v_t − S'ᵀk_t)ᵀ
    output:                                           o_t = S_tᵀ (s·q_t)

with S ``(d_k, d_v)`` key-first. The chunked form (Yang et al. 2024, GLA §3 and DeltaNet
§3) splits the sequence into chunks of C tokens: inside a chunk, matmuls (C × C scores
weighted by the decays between positions); between chunks, the state, carried by a scan
over chunks. The delta rule's chunk uses the UT transform: with L = tril(diag(β)(KKᵀ ⊙ Γ),
−1), T = (I + L)⁻¹, W = T(β ⊙ K ⊙ e^{G}) and U = T(β ⊙ V), the chunk's corrected values are
V' = U − W S₀ (Yang et al. 2024, DeltaNet §3.2, eq. 7-9; Gated DeltaNet, Yang et al. 2025, §3).

Numerics: decays live in log space. The decay between positions j ≤ r is the segment sum
Σ_{j<i≤r} g_i, formed by a masked cumulative sum of the increments rather than as a
difference of two running sums (no cancellation; Mamba-2's ``segsum``), and the exponent is
masked before ``exp`` by position, never by sign, so the upper triangle neither overflows
nor leaks NaN into gradients. Every exponent taken is ≤ 0.

Segments (packed sequences): ``reset[t]`` drops the state before token t. Inside a chunk,
positions interact only within one segment (counted by a running sum of resets); only rows
of the chunk's first segment read the carried state, only rows of its last segment reach
the chunk's end, and the carried state survives the chunk only when no reset lies in it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

# Chunks whose per-dimension decays are formed at once (see chunk_quantities).
_CHUNKS_AT_ONCE = 32


class Chunks(NamedTuple):
    """The chunk-parallel quantities of one state head, ``N`` chunks of ``C`` tokens.

    Attributes:
      scores: ``(N, G, C, C)``: s·q_r·(decayed k_j) for j ≤ r in one segment, else 0.
      q_in: ``(N, G, C, d_k)``: s·q_r ⊙ e^{G_r}, the rows that read the carried state.
      k_out: ``(N, C, d_k)``: k_j ⊙ e^{Σ_{j<i≤C} g_i}, the rows that reach the chunk's end.
      decay: ``(N, K)``: the carried state's decay over the chunk (0 after a reset).
      values: ``(N, C, d_v)``: V (additive) or U = T(β ⊙ V) (delta rule).
      w: ``(N, C, d_k)`` W = T(β ⊙ K ⊙ e^{G}) for the delta rule; None for additive.
    """

    scores: Array
    q_in: Array
    k_out: Array
    decay: Array
    values: Array
    w: Array | None


def _segment_sums(g: Array) -> Array:
    """``(C, C, 1)``: Σ_{j<i≤r} g_i at [r, j] for j ≤ r (0 on the diagonal), for one decay
    per head; other entries are not used. A cumulative sum of the masked increments, with no
    cancellation (Mamba-2's ``segsum``)."""
    c = g.shape[0]
    later = jnp.arange(c)[:, None] > jnp.arange(c)[None, :]  # i > j
    increments = jnp.where(later[:, :, None], g[:, None, :], 0.0)
    return jnp.cumsum(increments, axis=0)


def _decay_weights(g_in: Array, linked: Array) -> Array:
    """``(C, C, d)``: e^{G_rd − G_jd} where ``linked`` [r, j], else 0, for running sums G.

    The exponent is the difference of the chunk's running sums, which costs one pass over
    the C × C × d tensor instead of three; its rounding is that of the running sums,
    eps·Σ_{i≤r}|g_i|. Unlinked pairs get exponent 0 before ``exp`` (no overflow)."""
    exponent = jnp.where(linked[..., None], g_in[:, None, :] - g_in[None, :, :], 0.0)
    return jnp.where(linked[..., None], jnp.exp(exponent), 0.0)


@jax.custom_vjp
def _decayed_pair(x: Array, y: Array, g_in: Array, linked: Array) -> Array:
    """``(C, C)``: Σ_d x_rd y_jd e^{G_rd − G_jd} where ``linked``, else 0 (a decay per key
    dimension, G = ``g_in`` the running sums).

    Its gradient (GLA, Yang et al. 2024, §4.1) never forms the C × C × d cotangent: with
    dx = Σ_j ds_rj y_j ⊙ W_rj and dy = Σ_r ds_rj x_r ⊙ W_rj, the exponent's gradient is
    dG = x ⊙ dx − y ⊙ dy, so the backward pass is one recomputation of W and two
    contractions."""
    return jnp.einsum("rd,jd,rjd->rj", x, y, _decay_weights(g_in, linked))


def _decayed_pair_fwd(x, y, g_in, linked):
    return _decayed_pair(x, y, g_in, linked), (x, y, g_in, linked)


def _decayed_pair_bwd(residuals, d_scores):
    x, y, g_in, linked = residuals
    weights = _decay_weights(g_in, linked)
    dx = jnp.einsum("rj,jd,rjd->rd", d_scores, y, weights)
    dy = jnp.einsum("rj,rd,rjd->jd", d_scores, x, weights)
    return dx, dy, x * dx - y * dy, None


_decayed_pair.defvjp(_decayed_pair_fwd, _decayed_pair_bwd)


@jax.custom_vjp
def _unit_lower_inverse(lower: Array) -> Array:
    """(I + L)⁻¹ for a strictly lower-triangular L ``(C, C)``, by block doubling: the inverses
    of the diagonal blocks of size s give those of size 2s through
    [[A, 0], [B, D]]⁻¹ = [[A⁻¹, 0], [−D⁻¹BA⁻¹, D⁻¹]], from s = 1 (unit diagonal) up, so
    log₂C rounds of batched matmuls and no row-by-row loop (C is padded to a power of two
    with identity rows, which leaves the leading block's inverse unchanged).

    Its gradient is written out, dL = −Tᵀ dT Tᵀ on the strict lower triangle (T the
    inverse), two C × C matmuls, rather than differentiated through the doubling rounds:
    the training step's program is smaller (a DeltaNet step compiles about a quarter
    faster on CPU) and its backward pass faster."""
    c = lower.shape[0]
    size = 1 << max(c - 1, 0).bit_length()
    m = jnp.pad(lower, ((0, size - c), (0, size - c))) + jnp.eye(size, dtype=lower.dtype)
    inverse = jnp.ones((size, 1, 1), lower.dtype)  # the 1 × 1 diagonal blocks' inverses
    s = 1
    while s < size:
        blocks = size // (2 * s)
        diag = m.reshape(blocks, 2 * s, blocks, 2 * s)[jnp.arange(blocks), :, jnp.arange(blocks)]
        a_inv, d_inv = inverse[0::2], inverse[1::2]
        low = -d_inv @ diag[:, s:, :s] @ a_inv
        top = jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], axis=2)
        inverse = jnp.concatenate([top, jnp.concatenate([low, d_inv], axis=2)], axis=1)
        s *= 2
    return inverse[0, :c, :c]


def _unit_lower_inverse_fwd(lower: Array) -> tuple[Array, Array]:
    inverse = _unit_lower_inverse(lower)
    return inverse, inverse


def _unit_lower_inverse_bwd(inverse: Array, d_inverse: Array) -> tuple[Array]:
    return (jnp.tril(-(inverse.T @ d_inverse @ inverse.T), -1),)


_unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def _one_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array | None,
               reset: Array, scale: float) -> Chunks:
    """The quantities of one chunk: q ``(G, C, d_k)``, k ``(C, d_k)``, v ``(C, d_v)``,
    g ``(C, K)``, beta ``(C,)`` or None, reset bool ``(C,)``."""
    c = k.shape[0]
    seg = jnp.cumsum(reset.astype(jnp.int32))
    same = seg[:, None] == seg[None, :]
    causal = jnp.tril(jnp.ones((c, c), bool)) & same
    if g.shape[-1] > 1:
        g_run = jnp.cumsum(g, axis=0)
        pair = lambda x, y: _decayed_pair(x, y, g_run, causal)  # noqa: E731
    else:
        sums = _segment_sums(g)[..., 0]
        # Masked before exp: unlinked pairs get exponent 0, then weight 0.
        weights = jnp.where(causal, jnp.exp(jnp.where(causal, sums, 0.0)), 0.0)
        pair = lambda x, y: (x @ y.T) * weights  # noqa: E731
    first = seg == 0
    last = seg == seg[-1]
    g_in = jnp.cumsum(g, axis=0)  # Σ_{i≤r} g_i
    # Σ_{j<i<C} g_i as a suffix sum (no difference of running sums).
    g_out = jnp.concatenate([jnp.cumsum(g[::-1], axis=0)[::-1][1:], jnp.zeros_like(g[:1])])
    e_in = jnp.where(first[:, None], jnp.exp(g_in), 0.0)
    e_out = jnp.where(last[:, None], jnp.exp(g_out), 0.0)
    decay = jnp.where(seg[-1] == 0, jnp.exp(g_in[-1]), 0.0)
    sq = q * scale
    scores = jax.vmap(lambda x: pair(x, k))(sq)
    q_in = sq * e_in[None]
    k_out = k * e_out
    if beta is None:
        return Chunks(scores, q_in, k_out, decay, v, None)
    strict = causal & ~jnp.eye(c, dtype=bool)
    lower = beta[:, None] * jnp.where(strict, pair(k, k), 0.0)
    # T = (I + L)^{-1}, applied to the right-hand sides of W and U together.
    rhs = jnp.concatenate([beta[:, None] * k * e_in, beta[:, None] * v], axis=-1)
    solved = _unit_lower_inverse(lower) @ rhs
    w, u = solved[:, :k.shape[1]], solved[:, k.shape[1]:]
    return Chunks(scores, q_in, k_out, decay, u, w)


def chunk_quantities(q: Array, k: Array, v: Array, g: Array, beta: Array | None,
                     reset: Array, *, scale: float, chunk_size: int) -> tuple[Chunks, int]:
    """Pads the sequence to whole chunks and computes every chunk's quantities at once.

    Args:
      q: ``(G, n, d_k)``, the G query heads that read this state head.
      k: ``(n, d_k)``; v: ``(n, d_v)``; g: ``(n, K)`` log-decays ≤ 0 (K = 1 or d_k);
      beta: ``(n,)`` or None; reset: bool ``(n,)``. All in the compute dtype.
      scale: s.
      chunk_size: C (at most n is used).

    Returns:
      ``(chunks, n)``. Padded tail tokens are the identity (g = 0, k = v = 0, β = 0).
    """
    n = k.shape[0]
    c = min(chunk_size, n)
    pad = (-n) % c
    num = (n + pad) // c

    def split(x: Array, axis: int = 0) -> Array:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        x = jnp.pad(x, widths)
        return jnp.moveaxis(x.reshape(*x.shape[:axis], num, c, *x.shape[axis + 1:]), axis, 0)

    parts = (split(q, 1), split(k), split(v), split(g),
             None if beta is None else split(beta), split(reset))
    one = lambda q_, k_, v_, g_, b_, r_: _one_chunk(q_, k_, v_, g_, b_, r_, scale)  # noqa: E731
    if g.shape[-1] == 1 or num <= _CHUNKS_AT_ONCE:
        in_axes = (0, 0, 0, 0, None if beta is None else 0, 0)
        return jax.vmap(one, in_axes=in_axes)(*parts), n
    # A decay per key dimension forms a C × C × d_k tensor per chunk: a few chunks at a
    # time keep it in cache instead of materialising it for the whole sequence.
    return jax.lax.map(lambda xs: one(*xs), parts, batch_size=_CHUNKS_AT_ONCE), n


def _decay_state(decay: Array, state: Array) -> Array:
    """Diag(decay) S for decay ``(K,)``, K = 1 or d_k, and S ``(d_k, d_v)``."""
    return decay[:, None] * state


def associative_states() -> bool:
    """Whether the additive methods' state pass is an associative scan over chunks (off CPU)
    rather than a sequential one; read when a function is traced."""
    return jax.default_backend() != "cpu"


def run_chunks(chunks: Chunks, state: Array) -> tuple[Array, Array]:
    """The outputs of every chunk and the final state, from the entering ``state``.

    Returns:
      ``(out, final)``: out ``(G, N·C, d_v)`` (padded tail included), final ``(d_k, d_v)``.
    """
    if chunks.w is None and associative_states():
        # S_{c+1} = Diag(a_c) S_c + ΔS_c is a linear recurrence: an associative scan of the
        # pairs (a, ΔS) under (a₂, S₂) ∘ (a₁, S₁) = (a₂a₁, a₂S₁ + S₂), log₂N rounds of
        # elementwise work instead of N sequential steps, for accelerators. On CPU the
        # sequential scan below is 2.7-5× faster forward and backward (it passes over the N
        # states once; benchmarks/recurrent_cpu).
        written = jnp.einsum("ncd,nce->nde", chunks.k_out, chunks.values)
        decays = chunks.decay[..., None]
        written = written.at[0].add(_decay_state(chunks.decay[0], state))

        def combine(first, second):
            return first[0] * second[0], second[0] * first[1] + second[1]

        _, leaving = jax.lax.associative_scan(combine, (decays, written))
        entering = jnp.concatenate([state[None], leaving[:-1]], axis=0)
        final = leaving[-1]
        out = (jnp.einsum("ngcd,nde->ngce", chunks.q_in, entering)
               + jnp.einsum("ngcj,nje->ngce", chunks.scores, chunks.values))
    else:
        def step(s, chunk):
            # The delta rule corrects the chunk's values by what the state already holds.
            corrected = chunk.values if chunk.w is None else chunk.values - chunk.w @ s
            o = chunk.q_in @ s + chunk.scores @ corrected
            return _decay_state(chunk.decay, s) + chunk.k_out.T @ corrected, o

        final, out = jax.lax.scan(step, state, chunks)
    g = out.shape[1]
    return jnp.moveaxis(out, 1, 0).reshape(g, -1, out.shape[-1]), final


def transition(chunks: Chunks, identity: Array | None = None) -> Array:
    """The map from the entering state to the leaving one, S_end = M S₀ + S_ext: M as
    ``(K,)`` (additive: a diagonal) or ``(d_k, d_k)`` (delta rule, by running the chunks'
    state pass on ``identity``, the d_k × d_k identity; None builds it)."""
    if chunks.w is None:
        return jnp.prod(chunks.decay, axis=0)

    def step(m, chunk):
        return _decay_state(chunk.decay, m) - chunk.k_out.T @ (chunk.w @ m), None

    d_k = chunks.w.shape[-1]
    if identity is None:
        identity = jnp.eye(d_k, dtype=chunks.w.dtype)
    m, _ = jax.lax.scan(step, identity, chunks)
    return m


def apply_transition(m: Array, state: Array) -> Array:
    """M S for M from :func:`transition`."""
    return _decay_state(m, state) if m.ndim == 1 else m @ state


def leaving_state(chunks: Chunks, zeros: Array | None = None) -> Array:
    """S_ext: the state that ``zeros`` (a zero entering state; None builds it) leaves after
    these chunks."""
    if zeros is None:
        d_k, d_v = chunks.k_out.shape[-1], chunks.values.shape[-1]
        zeros = jnp.zeros((d_k, d_v), chunks.values.dtype)
    _, final = run_chunks(chunks, zeros)
    return final
