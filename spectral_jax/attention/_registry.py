"""The one table of attention methods: configs, benchmarks, modules and tests derive from it."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Literal

from spectral_jax import UnknownNameError, UsageError
from spectral_jax.attention import _hints
from spectral_jax.attention._clustered import (
    clustered_attention,
    improved_clustered_attention,
)
from spectral_jax.attention._gated_linear import gated_linear_attention
from spectral_jax.attention._inducing_points import inducing_points_attention
from spectral_jax.attention._linear import linear_attention
from spectral_jax.attention._linformer import linformer_attention
from spectral_jax.attention._local import local_attention
from spectral_jax.attention._luna import luna_attention
from spectral_jax.attention._memory_compressed import memory_compressed_attention
from spectral_jax.attention._nystrom import nystrom_attention
from spectral_jax.attention._performer import performer_attention
from spectral_jax.attention._probsparse import probsparse_attention
from spectral_jax.attention._skyformer import kernelized_attention, skyformer_attention
from spectral_jax.attention._softmax import softmax_attention
from spectral_jax.attention._spectral_shift import spectral_shift_attention
from spectral_jax.attention._state import STATE_KINDS, StateKind

# The exact method every speed comparison includes.
BASELINE = "softmax"


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
                   "packed_sequence", "gates", "memory_conv"] | None = None
    conv_skip: bool = False
    weight_dropout: bool = False
    test_budget: int | None = None
    carry: tuple[str, str] | None = None
    linear_in_value: bool = True
    cached_decode: bool = False
    decode: Literal["kv_cache", "ring_buffer", "feature_state", "random_feature_state",
                    "gated_state", "compressed_memory"] | None = None
    sequence_parallel: Literal["ring", "halo", "compressed_gather", "landmark_reductions",
                               "feature_reductions", "summary_reductions",
                               "global_selection"] | None = None
    communication: str | None = None
    token_arrays: tuple[tuple[str, int, bool], ...] = ()

    @property
    def exact(self) -> bool:
        """Whether the method is itself exact: it is its own ``target``."""
        return self.target == self.name

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


ATTENTIONS: dict[str, AttentionSpec] = {
    spec.name: spec
    for spec in (
        AttentionSpec(
            name="softmax", fn=softmax_attention, source="Vaswani et al. 2017, eq. 1",
            cost="O(n²d)", supports_causal=True, target="softmax", weight_dropout=True,
            cached_decode=True, decode="kv_cache", sequence_parallel="ring",
            communication="(P - 1)(n/P)(d + d_v + 1)"),
        AttentionSpec(
            name="nystrom", fn=nystrom_attention, source="Xiong et al. 2021, eq. 14-15",
            cost="O(nmd + m³)", supports_causal=False, target="softmax",
            recorded=("num_landmarks", "pinv_iterations"), budget="num_landmarks",
            conv_skip=True, test_budget=8, sequence_parallel="landmark_reductions",
            communication="2m(d + d_v + 2) + 2P + 2"),
        AttentionSpec(
            name="spectral_shift", fn=spectral_shift_attention,
            source="Verma 2021 (arXiv:2103.05638) with Wang et al. 2014's spectral shift",
            cost="O(n(m + s)d + sm² + m³)", supports_causal=False, target="softmax",
            recorded=("num_landmarks", "pinv_iterations", "shift", "num_delta_rows"),
            budget="num_landmarks", conv_skip=True, test_budget=8,
            sequence_parallel="landmark_reductions",
            communication="2m(d + d_v + 2) + s(d + 2m + 6) + 3P + 3"),
        AttentionSpec(
            name="skyformer", fn=skyformer_attention, source="Chen et al. 2021, §4.2 eq. 4-6",
            cost="O(nmd + m³)", supports_causal=False, target="kernelized",
            recorded=("num_landmarks", "ridge", "pinv_iterations"), budget="num_landmarks",
            state="landmark_rng", test_budget=16, sequence_parallel="landmark_reductions",
            communication="m(d + d_v + 3) + 2P + 2"),
        AttentionSpec(
            name="kernelized", fn=kernelized_attention,
            source="exact Gaussian-kernel attention that Skyformer approximates "
                   "(Chen et al. 2021, §4.1)",
            cost="O(n²d)", supports_causal=False, target="kernelized",
            sequence_parallel="ring", communication="(P - 1)(n/P)(d + d_v + 1)"),
        AttentionSpec(
            name="linear", fn=linear_attention, source="Katharopoulos et al. 2020, eq. 6-9",
            cost="O(nd²)", supports_causal=True, target="softmax", recorded=("feature_map",),
            cached_decode=True, decode="feature_state", sequence_parallel="feature_reductions",
            communication="d(d_v + 1); causal: P·d(d_v + 1)"),
        AttentionSpec(
            name="performer", fn=performer_attention,
            source="Choromanski et al. 2021 (FAVOR+), Lemma 1", cost="O(nrd)",
            supports_causal=True, target="softmax", recorded=("num_features",),
            budget="num_features", state="random_features", test_budget=32,
            cached_decode=True, decode="random_feature_state",
            sequence_parallel="feature_reductions",
            communication="r(d_v + 1) + 2; causal: P·r(d_v + 1) + 2"),
        AttentionSpec(
            name="linformer", fn=linformer_attention, source="Wang et al. 2020, eq. 7",
            cost="O(nkd)", supports_causal=False, target="softmax", recorded=("proj_len",),
            budget="proj_len", state="length_projection", test_budget=16,
            sequence_parallel="summary_reductions", communication="k(d + d_v) + 1",
            token_arrays=(("key_projection", -1, False), ("value_projection", -1, False))),
        AttentionSpec(
            name="inducing_points", fn=inducing_points_attention,
            source="Lee et al. 2019 (Set Transformer), §3.2 ISAB", cost="O(nmd)",
            supports_causal=False, target="softmax", recorded=("num_inducing_points",),
            budget="num_inducing_points", state="inducing_points", test_budget=8,
            linear_in_value=False, sequence_parallel="summary_reductions",
            communication="m(d_v + 2)"),
        AttentionSpec(
            name="luna", fn=luna_attention, source="Ma et al. 2021 (Luna), §3 pack and unpack",
            cost="O(nld)", supports_causal=False, target="softmax",
            recorded=("packed_length",), budget="packed_length", state="packed_sequence",
            test_budget=8, carry=("packed_query", "return_packed"), linear_in_value=False,
            sequence_parallel="summary_reductions", communication="l(d_v + 2)"),
        AttentionSpec(
            name="gated_linear", fn=gated_linear_attention,
            source="Peng et al. 2021 (RFA), §3.2 RFA-Gate; Katharopoulos et al. 2020 feature "
                   "map",
            cost="O(nd²)", supports_causal=True, target="softmax", recorded=("feature_map",),
            state="gates", decode="gated_state", sequence_parallel="feature_reductions",
            communication="P(d(d_v + 1) + 1)", token_arrays=(("gates", -2, True),)),
        # The clustered methods and ProbSparse take the sampling key of "landmark_rng": a
        # random k-means start / key sample in training, the deterministic one in
        # evaluation. Both clustered methods' budget is num_clusters (with the default 100
        # clusters every 48-token test would be exact whatever topk is).
        AttentionSpec(
            name="clustered", fn=clustered_attention,
            source="Vyas, Katharopoulos & Fleuret 2020, §3.2 eq. 6-7 (k-means on the queries)",
            cost="O(nCd)", supports_causal=False, target="softmax",
            recorded=("num_clusters", "iterations"), budget="num_clusters",
            state="landmark_rng", test_budget=8, sequence_parallel="global_selection",
            communication="m(d + d_v + 4) + (t + 1)m(d + 1) + P + 1"),
        AttentionSpec(
            name="improved_clustered", fn=improved_clustered_attention,
            source="Vyas, Katharopoulos & Fleuret 2020, §3.3 eq. 9-10 (top-k keys per "
                   "cluster)",
            cost="O(n(C + k)d)", supports_causal=False, target="softmax",
            recorded=("num_clusters", "iterations", "topk"), budget="num_clusters",
            state="landmark_rng", test_budget=8, sequence_parallel="global_selection",
            communication="m(d + d_v + 5) + (t + 1)m(d + 1) + m·k(d + d_v + 1) "
                          "+ 2P·m·min(k, n/P) + P + 1"),
        AttentionSpec(
            name="probsparse", fn=probsparse_attention,
            source="Zhou et al. 2021 (Informer), §3 eq. 3-4 (ProbSparse, c·ln n active "
                   "queries)",
            cost="O(n log n · d)", supports_causal=False, target="softmax",
            recorded=("factor",), budget="factor", state="landmark_rng", test_budget=2,
            sequence_parallel="global_selection",
            communication="n(d + 1) + u(d + d_v + 3) + 2P·min(u, n/P) + d_v + P + 2; "
                          "rng=None: u(2d + d_v + 5) + 2P·min(u, n/P) + d_v + P + 2"),
        # The budget kernel_size is also the stride: a larger one compresses more (cheaper,
        # less accurate); 1 with identity weights is exact.
        AttentionSpec(
            name="memory_compressed", fn=memory_compressed_attention,
            source="Liu et al. 2018, §4.2.3 (strided conv of K and V, kernel = stride = 3)",
            cost="O(n²d/s)", supports_causal=True, target="softmax",
            recorded=("kernel_size",), budget="kernel_size", state="memory_conv",
            test_budget=3, decode="compressed_memory", sequence_parallel="compressed_gather",
            communication="(P·ceil(n/(P·c)) + c - 1)(d + d_v + 1)"),
        AttentionSpec(
            name="local", fn=local_attention,
            source="band attention: Parmar et al. 2018 §3.2; LRA's Local Attention "
                   "(Tay et al. 2021)",
            cost="O(nwd)", supports_causal=True, target="softmax", recorded=("window",),
            budget="window", test_budget=8, cached_decode=True, decode="ring_buffer",
            sequence_parallel="halo", communication="2w(d + d_v + 1); causal: w(d + d_v + 1)"),
    )
}
_hints.REGISTERED.update(ATTENTIONS)


def available_attentions() -> tuple[str, ...]:
    """The registered method names, e.g. ``("softmax", "nystrom", ...)``.

    Example:
      >>> from spectral_jax.attention import available_attentions
      >>> "spectral_shift" in available_attentions()
      True
    """
    return tuple(ATTENTIONS)


def budget_parameters() -> dict[str, tuple[str, ...]]:
    """Each budget parameter of the registered methods and the methods it sizes.

    Example:
      >>> from spectral_jax.attention import budget_parameters
      >>> budget_parameters()["num_features"]
      ('performer',)
    """
    params: dict[str, tuple[str, ...]] = {}
    for name, spec in ATTENTIONS.items():
        if spec.budget is not None:
            params[spec.budget] = (*params.get(spec.budget, ()), name)
    return params


def get_attention_spec(name: str) -> AttentionSpec:
    """The :class:`AttentionSpec` registered under ``name``.

    Raises:
      spectral_jax.UsageError: unknown name; the message lists the known ones.

    Example:
      >>> from spectral_jax.attention import get_attention_spec
      >>> get_attention_spec("performer").supports_causal
      True
    """
    if not isinstance(name, str) or name not in ATTENTIONS:
        raise UsageError(
            f"Unknown attention {name!r}; known attentions: {', '.join(ATTENTIONS)}."
        )
    return ATTENTIONS[name]


def get_attention(name: str) -> Callable[..., object]:
    """The attention function registered under ``name``.

    Args:
      name: one of :func:`available_attentions`.

    Returns:
      The pure function, with the ``jax.nn.dot_product_attention`` call shape.

    Raises:
      spectral_jax.UsageError: unknown name; the message lists the known ones.

    Example:
      >>> import jax.numpy as jnp
      >>> from spectral_jax.attention import get_attention
      >>> x = jnp.ones((2, 128, 4, 16))
      >>> get_attention("nystrom")(x, x, x, num_landmarks=16).shape
      (2, 128, 4, 16)
    """
    return get_attention_spec(name).fn
