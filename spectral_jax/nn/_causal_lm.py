"""A decoder-only language model: token embedding, causal pre-LayerNorm blocks, LM head."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spectral_jax import UsageError, UsageTypeError, _checks
from spectral_jax import attention as _attention
from spectral_jax.nn._config import TransformerConfig
from spectral_jax.nn._embedding import TokenEmbedding, sinusoidal_positions
from spectral_jax.nn._encoder import EncoderBlock

Array = jax.Array


class CausalLM(nnx.Module):
    """Next-token logits from token ids, with any attention method that has a causal form.

    The blocks are the encoder's (:class:`EncoderBlock`: pre-LayerNorm attention and MLP),
    all causal, then a final LayerNorm and a float32 linear head over the vocabulary
    (GPT-2, Radford et al. 2019, §2.3; the byte-level models of Al-Rfou et al. 2019). The
    model uses no padding mask: under causal attention a position never sees later ones, so
    trailing padding changes nothing at the real positions (left padding is not supported).

    Decoding follows ``flax.nnx.MultiHeadAttention``: :meth:`init_cache` gives every layer
    its decoding state (``nnx.Cache`` variables, sized by the method: a KV cache for
    softmax, ``φ(K)ᵀV`` for linear and performer, ...), then ``model(tokens, decode=True)``
    takes the next token (``(batch, 1)``; a longer ``(batch, n)`` prefills n tokens) and
    returns its logits, at the positions the cache has reached; :func:`generate` runs it.

    Args:
        config: the model configuration; ``is_causal`` must be True and ``vocab_size`` is
          also the number of logits (``num_classes`` is not used).
        rngs: ``"params"``, ``"dropout"`` and the attention's streams.

    Raises:
        spectral_jax.UsageTypeError: ``config`` is not a :class:`TransformerConfig`.
        spectral_jax.UsageError: ``config.is_causal`` is False.
        spectral_jax.UnsupportedError: a method without a causal form (the message lists
          those with one).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import CausalLM, TransformerConfig
        >>> config = TransformerConfig(vocab_size=10, num_classes=10, max_length=8,
        ...                            is_causal=True, attention="linear")
        >>> model = CausalLM(config, rngs=nnx.Rngs(0))
        >>> model(jnp.array([[3, 4, 5]]), deterministic=True).shape
        (1, 3, 10)
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs) -> None:
        if not isinstance(config, TransformerConfig):
            raise UsageTypeError(
                f"config must be a TransformerConfig, got {type(config).__name__}.")
        if not config.is_causal:
            raise UsageError(
                "CausalLM: config.is_causal must be True (a language model attends to earlier "
                f"tokens only); got False with attention={config.attention!r}.")
        self.config = config
        self.embedding = TokenEmbedding(
            config.vocab_size, config.embed_dim, config.max_length,
            positional=config.positional, embed_init_std=config.embed_init_std,
            dropout_rate=config.dropout_rate, dtype=config.dtype,
            param_dtype=config.param_dtype, rngs=rngs,
        )
        self.layers = nnx.List([
            EncoderBlock(config, config.attention_kwargs_dict, rngs=rngs)
            for _ in range(config.num_layers)
        ])
        self.norm = nnx.LayerNorm(config.embed_dim, dtype=config.dtype,
                                  param_dtype=config.param_dtype, rngs=rngs)
        self.head = nnx.Linear(config.embed_dim, config.vocab_size, dtype=jnp.float32,
                               param_dtype=config.param_dtype, rngs=rngs)
        self.cache_batch: int | None = None
        self.cache_length: int | None = None

    def __call__(self, inputs: Array, *, deterministic: bool = True,
                 decode: bool = False, segment_ids: Array | None = None,
                 positions: Array | None = None) -> Array:
        """Logits of the next token at every position of ``inputs``.

        Args:
            inputs: int ``(batch, length)`` token ids, ``length <= config.max_length``; with
              ``decode``, the next ``length`` tokens after those already in the cache.
            deterministic: no dropout (evaluation, decoding).
            decode: one step with the cache from :meth:`init_cache`.
            segment_ids: int ``(batch, length)``: packed documents
              (:func:`spectral_jax.lra.data.packing.pack`); a token attends only within its
              document. Methods that cannot keep documents apart raise.
            positions: int ``(batch, length)``: each token's position in its document (for
              the position embedding and RoPE); None: ``arange(length)``, or with
              ``segment_ids`` each token's index in its run of equal ids.

        Returns:
            float32 ``(batch, length, vocab_size)``: position i scores the token at i + 1.

        Raises:
            spectral_jax.UsageTypeError: non-integer ``inputs``.
            spectral_jax.UsageError: ``length > config.max_length``; ``decode`` without a
              cache, with another batch size, or past the cache's length.
        """
        if decode:
            x = self._decode_embedding(inputs)
        else:
            if positions is None and segment_ids is not None:
                positions = _attention.segment_positions(segment_ids)
            x = self.embedding(inputs, deterministic=deterministic, positions=positions)
        for layer in self.layers:
            x = layer(x, None, deterministic=deterministic, decode=decode,
                      segment_ids=segment_ids, positions=positions)
        return self.head(self.norm(x).astype(jnp.float32))

    def init_cache(self, input_shape: tuple[int, int], dtype=jnp.float32) -> None:
        """Gives every layer an empty decoding state for ``input_shape`` and turns decoding on.

        Args:
            input_shape: ``(batch, max_length)``: the sequences' batch and the most tokens
              (prompt and generated) they will hold, at most ``config.max_length``.
            dtype: the dtype of the cached arrays.

        Raises:
            spectral_jax.UsageError: a shape that is not two positive ints, or a length above
              ``config.max_length``.
            spectral_jax.UnsupportedError: the method has no decoding form.
        """
        if len(tuple(input_shape)) != 2:
            raise UsageError(f"CausalLM.init_cache: input_shape must be (batch, max_length), "
                             f"got {tuple(input_shape)}.")
        batch, length = (_checks.positive_int("CausalLM.init_cache", name, value)
                         for name, value in zip(("batch", "max_length"), input_shape))
        if length > self.config.max_length:
            raise UsageError(
                f"CausalLM.init_cache: max_length={length} is above the model's "
                f"config.max_length={self.config.max_length} (its positions end there).")
        for layer in self.layers:
            layer.attention.init_cache((batch, length, self.config.embed_dim), dtype)
        self.cache_index = nnx.Cache(jnp.zeros((), jnp.int32))
        self.cache_batch, self.cache_length = batch, length

    def _decode_embedding(self, inputs: Array) -> Array:
        """The embeddings of the next tokens at the cache's positions; advances them."""
        if not hasattr(self, "cache_index"):
            raise UsageError("CausalLM: decode=True needs init_cache(input_shape) first.")
        if inputs.ndim != 2 or inputs.shape[0] != self.cache_batch or inputs.shape[1] < 1:
            raise UsageError(
                f"CausalLM: decode=True takes the next tokens, (batch, n >= 1) with the "
                f"cache's batch={self.cache_batch}; got shape {inputs.shape}.")
        index, count = self.cache_index[...], inputs.shape[1]
        if not isinstance(index, jax.core.Tracer) and int(index) + count > self.cache_length:
            raise UsageError(
                f"CausalLM: decoding {count} more token(s) after {int(index)} needs "
                f"{int(index) + count} positions, past the cache's max_length="
                f"{self.cache_length}; call init_cache with a larger max_length.")
        emb = self.embedding
        x = emb.embed(emb._checked_ids(inputs))
        if emb.positional in ("sinusoidal", "learned"):
            table = (jnp.asarray(sinusoidal_positions(self.config.max_length, x.shape[-1]))
                     if emb.positional == "sinusoidal" else emb.position_table[...])
            rows = jax.lax.dynamic_slice_in_dim(table, index, count)
            x = x + rows[None].astype(x.dtype)
        self.cache_index[...] = index + count
        return x


def _check_generate(model: CausalLM, prompt: Array, max_new_tokens: int,
                    temperature: float) -> tuple[np.ndarray, int, float]:
    if not isinstance(model, CausalLM):
        raise UsageTypeError(f"generate: model must be a CausalLM, got {type(model).__name__}.")
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise UsageError(f"generate: prompt must be int (batch, length >= 1) token ids; got "
                         f"{prompt.dtype} {prompt.shape}.")
    max_new_tokens = _checks.positive_int("generate", "max_new_tokens", max_new_tokens)
    temperature = _checks.number("generate", "temperature", temperature, low=0.0)
    total, limit = prompt.shape[1] + max_new_tokens, model.config.max_length
    if total > limit:
        raise UsageError(
            f"generate: the prompt ({prompt.shape[1]} tokens) and max_new_tokens="
            f"{max_new_tokens} need {total} positions; the model has max_length={limit}: "
            f"shorten the prompt to at most {limit - max_new_tokens} tokens or ask for fewer.")
    return prompt.astype(np.int32), max_new_tokens, temperature


def _banned_mask(banned_tokens: Any, vocab_size: int) -> np.ndarray:
    """bool ``(vocab_size,)``: True at the banned ids, checked to leave one id to choose."""
    ids = None if isinstance(banned_tokens, (str, bytes)) else np.asarray(banned_tokens)
    if ids is None or ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise UsageTypeError(_checks.message("generate", "banned_tokens",
                                             "a sequence of int token ids", banned_tokens))
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise UsageError(
            f"generate: `banned_tokens` must be token ids in [0, vocab_size) = [0, "
            f"{vocab_size}); got {bad.tolist()} in {banned_tokens!r}.")
    banned = np.zeros(vocab_size, bool)
    banned[ids.astype(np.int64)] = True
    if banned.all():
        raise UsageError(
            f"generate: `banned_tokens` bans every token of the vocabulary (vocab_size="
            f"{vocab_size}), which leaves nothing to sample; leave at least one id allowed.")
    return banned


def generate(model: CausalLM, prompt: Array, max_new_tokens: int, *,
             temperature: float = 0.0, seed: int = 0,
             banned_tokens: tuple[int, ...] = ()) -> np.ndarray:
    """Continues ``prompt`` by ``max_new_tokens`` tokens, decoding with the cache.

    The prompt enters the cache in one call (prefill), then each new token is chosen from
    the last logits and fed back, one token per call: the whole sequence is never run
    again, so a step costs what the method's decoding state costs (constant in the context
    for linear, performer and gated_linear). ``temperature=0`` is greedy (argmax); above 0,
    tokens are drawn from ``softmax(logits / temperature)`` with ``jax.random.key(seed)``, so
    a seed gives one continuation. ``model.init_cache`` is called here (the model's cache is reset).

    Args:
        model: a :class:`CausalLM` (evaluated deterministically).
        prompt: int ``(batch, length)`` token ids.
        max_new_tokens: how many tokens to add, >= 1; ``length + max_new_tokens`` must fit in
          ``config.max_length``.
        temperature: 0 (greedy) or the sampling temperature.
        seed: the sampling key's seed.
        banned_tokens: ids never chosen (e.g. the padding id 0), each in
          ``[0, vocab_size)``; at least one id must stay allowed.

    Returns:
        int32 numpy ``(batch, max_new_tokens)``: the new tokens.

    Raises:
        spectral_jax.UsageError: a prompt that is not 2-D int ids, a negative temperature, a
          prompt and continuation longer than ``config.max_length``, or ``banned_tokens``
          with an id outside ``[0, vocab_size)`` or holding every id.
        spectral_jax.UsageTypeError: ``banned_tokens`` not a sequence of ints.
        spectral_jax.UnsupportedError: the method has no decoding form.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from spectral_jax.nn import CausalLM, TransformerConfig, generate
        >>> config = TransformerConfig(vocab_size=10, num_classes=10, max_length=8,
        ...                            is_causal=True, attention="linear")
        >>> model = CausalLM(config, rngs=nnx.Rngs(0))
        >>> generate(model, jnp.array([[3, 4, 5]]), 4).shape
        (1, 4)
    """
    prompt, max_new_tokens, temperature = _check_generate(model, prompt, max_new_tokens,
                                                          temperature)
    _attention.get_attention_spec(model.config.attention)  # an unknown name fails here
    banned = jnp.asarray(_banned_mask(banned_tokens, model.config.vocab_size))
    batch, length = prompt.shape
    model.init_cache((batch, length + max_new_tokens), jnp.float32)

    @nnx.jit
    def step(model_, token, key):
        logits = model_(token, deterministic=True, decode=True)[:, -1]
        logits = jnp.where(banned, -jnp.inf, logits)
        if temperature == 0.0:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits / temperature).astype(jnp.int32)

    keys = jax.random.split(jax.random.key(seed), max_new_tokens)
    token = step(model, jnp.asarray(prompt), keys[0])[:, None]  # prefill: the whole prompt
    out = [token]
    for i in range(1, max_new_tokens):
        token = step(model, token, keys[i])[:, None]
        out.append(token)
    return np.asarray(jnp.concatenate(out, axis=1))
