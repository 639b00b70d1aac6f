"""One registered attention method's entry: :class:`AttentionSpec`, the registry's row type."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Literal

from spectral_jax import UnknownNameError
from spectral_jax.attention._state import STATE_KINDS, StateKind


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """Everything the library needs to know about one registered method.

    Attributes:
      name: the short registry name.
      fn: the pure attention function.
      source: paper and equation, for the README table.
      cost: time per head, e.g. ``"O(nmd + m³)"`` (n length, d head_dim, m the budget).
      supports_causal: whether ``is_causal=True`` is implemented.
      target: the exact registered method it approximates (itself when exact).
      recorded: the parameters every training config records (they define a result); their
        defaults come from ``fn``'s signature, or from the state kind's options.
      budget: the parameter that trades cost for accuracy (a parameter of ``fn`` or an option
        of the state kind), or None.
      state: the kind of state a caller supplies, a key of ``STATE_KINDS``, or None.
      conv_skip: whether modules may add Nyströmformer's depthwise conv skip on V
        (module option ``conv_kernel_size``).
      weight_dropout: whether the method forms attention weights that dropout can drop.
      test_budget: a small budget at which the method still approximates on the tests'
        48-token inputs.
      carry: ``(argument, flag)`` when the method also returns the next layer's value of a
        state argument, called with ``flag=True`` (Luna: ``("packed_query",
        "return_packed")``, returning ``(out, P')``), else None. ``TransformerEncoder``
        carries it from block to block.
      linear_in_value: whether the output is a fixed n×n matrix times V (``bench error``'s
        matrix errors need it); False where a summary of V is read as keys (inducing
        points, Luna).
      cached_decode: whether one causal query against a key/value cache, with the mask
        that Flax's ``nnx.MultiHeadAttention(decode=True)`` passes, equals that position of
        the causal run over the whole sequence (token-by-token decoding through ``fn`` as
        Flax's ``attention_fn``); a method without it refuses that call.
      decode: the decode form (a key of ``spectral_jax.attention.DECODE_FORMS``: the state
        ``prefill``/``decode_step`` carry from token to token), for every method with a causal
        form; None without one.
      token_arrays: ``(argument, axis, batched)`` of the array arguments with one entry per
        key position along ``axis`` (Linformer's projections, RFA-Gate's gates), split with
        the sequence by :func:`spectral_jax.parallel.sequence_parallel`; ``batched``: the
        dims before ``axis`` are the batch dims.
      sequence_parallel: how the method runs on a sequence split over devices (a key of
        ``spectral_jax.attention.SHARD_FORMS``), or None where it cannot.
      communication: the elements of the collectives' results (all-reduce, all-gather,
        collective-permute) per forward call and (example, head) in that form, as ``cost``
        gives time (symbols: P devices, n length, d and d_v head dims, m landmarks or
        inducing points, r features, k projected length, s sampled δ rows, l packed length,
        w window, c kernel size); ``"...; causal: ..."`` gives the causal form's. Checked
        against the compiled program by ``tests/test_parallel_sequence.py``. The clustered
        methods' m is the clusters, k the top keys per cluster and t the Lloyd steps;
        ProbSparse's u is its factor·⌈ln n⌉ active queries, and ``"...; rng=None: ..."``
        gives its evenly spaced key sample's form (the random one gathers every key).
      grouped_values: whether the function takes more value heads than key heads (a
        multiple, with as many query heads as key heads; value head j is read with key head
        j // G): the state-keeping methods linear in V, whose sums over keys are then made
        once per key head.
      layer: the paper's layer around the method, as module options and their defaults
        (``short_conv_size``, ``output_gate``: :mod:`spectral_jax.nn._recurrent_layer`), or
        None for a plain attention layer.
    """

    name: str
    fn: Callable[..., Any]
    source: str
    cost: str
    supports_causal: bool
    target: str
    recorded: tuple[str, ...] = ()
    budget: str | None = None
    state: Literal["random_features", "length_projection", "landmark_rng", "inducing_points",
                   "packed_sequence", "gates", "memory_conv", "log_decay", "delta",
                   "gated_delta", "ssd"] | None = None
    conv_skip: bool = False
    weight_dropout: bool = False
    test_budget: int | None = None
    carry: tuple[str, str] | None = None
    linear_in_value: bool = True
    cached_decode: bool = False
    decode: Literal["kv_cache", "ring_buffer", "feature_state", "random_feature_state",
                    "gated_state", "compressed_memory", "recurrent_state"] | None = None
    sequence_parallel: Literal["ring", "halo", "compressed_gather", "landmark_reductions",
                               "feature_reductions", "summary_reductions",
                               "global_selection", "state_prefix"] | None = None
    communication: str | None = None
    token_arrays: tuple[tuple[str, int, bool], ...] = ()
    layer: tuple[tuple[str, Any], ...] | None = None
    grouped_values: bool = False

    @property
    def exact(self) -> bool:
        """Whether the method is itself exact: it is its own ``target``."""
        return self.target == self.name

    @property
    def family(self) -> str:
        """The family package of ``spectral_jax.attention`` that holds ``fn`` (its docs page).

        Example:
          >>> from spectral_jax.attention import get_attention_spec
          >>> get_attention_spec("spectral_shift").family
          'landmark'
        """
        return self.fn.__module__.split(".")[2]

    @property
    def causal_only(self) -> bool:
        """Whether ``is_causal=False`` is refused (a recurrence such as RFA-Gate): ``fn``'s
        ``is_causal`` defaults to True."""
        return inspect.signature(self.fn).parameters["is_causal"].default is True

    @property
    def state_kind(self) -> StateKind | None:
        """The :class:`StateKind` named by ``state``, or None."""
        return None if self.state is None else STATE_KINDS[self.state]

    def default(self, parameter: str) -> Any:
        """The one default of a recorded parameter: ``fn``'s signature, else the state kind's.

        Raises:
          spectral_jax.UnknownNameError: the parameter has a default in neither.
        """
        param = inspect.signature(self.fn).parameters.get(parameter)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
        kind = self.state_kind
        if kind is not None and parameter in kind.options:
            return kind.options[parameter]
        raise UnknownNameError(f"{self.name}: parameter {parameter!r} has no default in "
                       f"{self.fn.__name__} nor in state {self.state!r}.")

    def config_defaults(self) -> dict[str, Any]:
        """``{parameter: default}`` for every recorded parameter.

        Example:
          >>> from spectral_jax.attention import get_attention_spec
          >>> get_attention_spec("skyformer").config_defaults()
          {'num_landmarks': 128, 'ridge': 0.1, 'pinv_iterations': 6}
        """
        return {name: self.default(name) for name in self.recorded}

    def make_state(self, rng: Any, *, budget: int | None, length: int,
                   head_dim: int) -> dict[str, Any]:
        """The state keyword arguments of ``fn`` drawn from ``rng`` (``{}`` without state).

        Args:
          rng: a ``jax.random`` key.
          budget: the state's size when the budget is the state kind's size option (e.g.
            Performer's num_features); None: the kind's default.
          length: key sequence length n.
          head_dim: d.

        Example:
          >>> import jax
          >>> from spectral_jax.attention import get_attention_spec
          >>> spec = get_attention_spec("performer")
          >>> spec.make_state(jax.random.key(0), budget=16, length=64, head_dim=8)[
          ...     "projection"].shape
          (16, 8)
        """
        kind = self.state_kind
        if kind is None:
            return {}
        size = None
        if kind.size is not None:
            size = budget if budget is not None else kind.options[kind.size]
        return kind.build(rng, size=size, length=length, head_dim=head_dim)

    def call_kwargs(self, rng: Any, *, budget: int | None, length: int,
                    head_dim: int) -> dict[str, Any]:
        """``fn``'s keyword arguments at ``budget``: the budget parameter and the state.

        Example:
          >>> import jax
          >>> from spectral_jax.attention import get_attention_spec
          >>> get_attention_spec("nystrom").call_kwargs(jax.random.key(0), budget=8,
          ...     length=64, head_dim=8)
          {'num_landmarks': 8}
        """
        return {**self.budget_kwargs(budget),
                **self.make_state(rng, budget=budget, length=length, head_dim=head_dim)}

    def budget_kwargs(self, budget: int | None) -> dict[str, Any]:
        """``{budget: value}`` when the budget is a parameter of ``fn``, else ``{}``.

        Example:
          >>> from spectral_jax.attention import get_attention_spec
          >>> get_attention_spec("nystrom").budget_kwargs(8)
          {'num_landmarks': 8}
        """
        if budget is None or self.budget not in inspect.signature(self.fn).parameters:
            return {}
        return {self.budget: budget}
