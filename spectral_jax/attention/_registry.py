"""The one table of attention methods: configs, benchmarks, modules and tests derive from it."""

from __future__ import annotations

from collections.abc import Callable

from spectral_jax import UsageError
from spectral_jax.attention import compressed, exact, kernel, landmark, recurrent, sparse, summary
from spectral_jax.attention._spec import AttentionSpec
from spectral_jax.attention.core import _hints

# The exact method every speed comparison includes.
BASELINE = "softmax"


ATTENTIONS: dict[str, AttentionSpec] = {
    spec.name: spec
    for spec in (
        AttentionSpec(
            name="softmax", fn=exact.softmax_attention, source="Vaswani et al. 2017, eq. 1",
            cost="O(n²d)", supports_causal=True, target="softmax", weight_dropout=True,
            cached_decode=True, decode="kv_cache", sequence_parallel="ring",
            communication="(P - 1)(n/P)(d + d_v + 1)",
            token_arrays=(("segment_ids", -1, True),)),
        AttentionSpec(
            name="nystrom", fn=landmark.nystrom_attention, source="Xiong et al. 2021, eq. 14-15",
            cost="O(nmd + m³)", supports_causal=False, target="softmax",
            recorded=("num_landmarks", "pinv_iterations"), budget="num_landmarks",
            conv_skip=True, test_budget=8, sequence_parallel="landmark_reductions",
            communication="2m(d + d_v + 2) + 2P + 2"),
        AttentionSpec(
            name="spectral_shift", fn=landmark.spectral_shift_attention,
            source="Verma 2021 (arXiv:2103.05638) with Wang et al. 2014's spectral shift",
            cost="O(n(m + s)d + sm² + m³)", supports_causal=False, target="softmax",
            recorded=("num_landmarks", "pinv_iterations", "shift", "num_delta_rows"),
            budget="num_landmarks", conv_skip=True, test_budget=8,
            sequence_parallel="landmark_reductions",
            communication="2m(d + d_v + 2) + s(d + m + 6) + 3P + 3"),
        AttentionSpec(
            name="skyformer", fn=landmark.skyformer_attention,
            source="Chen et al. 2021, §4.2 eq. 4-6",
            cost="O(nmd + m³)", supports_causal=False, target="kernelized",
            recorded=("num_landmarks", "ridge", "pinv_iterations"), budget="num_landmarks",
            state="landmark_rng", test_budget=16, sequence_parallel="landmark_reductions",
            communication="m(d + d_v + 3) + 2P + 2"),
        AttentionSpec(
            name="kernelized", fn=exact.kernelized_attention,
            source="exact Gaussian-kernel attention that Skyformer approximates "
                   "(Chen et al. 2021, §4.1)",
            cost="O(n²d)", supports_causal=False, target="kernelized",
            sequence_parallel="ring", communication="(P - 1)(n/P)(d + d_v + 1)"),
        AttentionSpec(
            name="linear", fn=kernel.linear_attention, source="Katharopoulos et al. 2020, eq. 6-9",
            cost="O(nd²)", supports_causal=True, target="softmax", recorded=("feature_map",),
            cached_decode=True, decode="feature_state", sequence_parallel="feature_reductions",
            communication="d(d_v + 1); causal: P·d(d_v + 1)",
            token_arrays=(("segment_ids", -1, True),), grouped_values=True),
        AttentionSpec(
            name="performer", fn=kernel.performer_attention,
            source="Choromanski et al. 2021 (FAVOR+), Lemma 1", cost="O(nrd)",
            supports_causal=True, target="softmax", recorded=("num_features",),
            budget="num_features", state="random_features", test_budget=32,
            cached_decode=True, decode="random_feature_state",
            sequence_parallel="feature_reductions",
            communication="r(d_v + 1) + 2; causal: P·r(d_v + 1) + 2",
            token_arrays=(("segment_ids", -1, True),), grouped_values=True),
        AttentionSpec(
            name="linformer", fn=compressed.linformer_attention, source="Wang et al. 2020, eq. 7",
            cost="O(nkd)", supports_causal=False, target="softmax", recorded=("proj_len",),
            budget="proj_len", state="length_projection", test_budget=16,
            sequence_parallel="summary_reductions", communication="k(d + d_v) + 1",
            token_arrays=(("key_projection", -1, False), ("value_projection", -1, False))),
        AttentionSpec(
            name="inducing_points", fn=summary.inducing_points_attention,
            source="Lee et al. 2019 (Set Transformer), §3.2 ISAB", cost="O(nmd)",
            supports_causal=False, target="softmax", recorded=("num_inducing_points",),
            budget="num_inducing_points", state="inducing_points", test_budget=8,
            linear_in_value=False, sequence_parallel="summary_reductions",
            communication="m(d_v + 2)"),
        AttentionSpec(
            name="luna", fn=summary.luna_attention,
            source="Ma et al. 2021 (Luna), §3 pack and unpack",
            cost="O(nld)", supports_causal=False, target="softmax",
            recorded=("packed_length",), budget="packed_length", state="packed_sequence",
            test_budget=8, carry=("packed_query", "return_packed"), linear_in_value=False,
            sequence_parallel="summary_reductions", communication="l(d_v + 2)"),
        AttentionSpec(
            name="gated_linear", fn=kernel.gated_linear_attention,
            source="Peng et al. 2021 (RFA), §3.2 RFA-Gate; Katharopoulos et al. 2020 feature "
                   "map",
            cost="O(nd²)", supports_causal=True, target="softmax", recorded=("feature_map",),
            state="gates", decode="gated_state", sequence_parallel="feature_reductions",
            communication="P(d(d_v + 1) + 1)", token_arrays=(("gates", -2, True),),
            grouped_values=True),
        # The clustered methods and ProbSparse take the sampling key of "landmark_rng": a
        # random k-means start / key sample in training, the deterministic one in
        # evaluation. Both clustered methods' budget is num_clusters (with the default 100
        # clusters every 48-token test would be exact whatever topk is).
        AttentionSpec(
            name="clustered", fn=sparse.clustered_attention,
            source="Vyas, Katharopoulos & Fleuret 2020, §3.2 eq. 6-7 (k-means on the queries)",
            cost="O(nCd)", supports_causal=False, target="softmax",
            recorded=("num_clusters", "iterations"), budget="num_clusters",
            state="landmark_rng", test_budget=8, sequence_parallel="global_selection",
            communication="m(d + d_v + 4) + (t + 1)m(d + 1) + P + 1"),
        AttentionSpec(
            name="improved_clustered", fn=sparse.improved_clustered_attention,
            source="Vyas, Katharopoulos & Fleuret 2020, §3.3 eq. 9-10 (top-k keys per "
                   "cluster)",
            cost="O(n(C + k)d)", supports_causal=False, target="softmax",
            recorded=("num_clusters", "iterations", "topk"), budget="num_clusters",
            state="landmark_rng", test_budget=8, sequence_parallel="global_selection",
            communication="m(d + d_v + 5) + (t + 1)m(d + 1) + m·k(d + d_v + 1) "
                          "+ 2P·m·min(k, n/P) + P + 1"),
        AttentionSpec(
            name="probsparse", fn=sparse.probsparse_attention,
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
            name="memory_compressed", fn=compressed.memory_compressed_attention,
            source="Liu et al. 2018, §4.2.3 (strided conv of K and V, kernel = stride = 3)",
            cost="O(n²d/s)", supports_causal=True, target="softmax",
            recorded=("kernel_size",), budget="kernel_size", state="memory_conv",
            test_budget=3, decode="compressed_memory", sequence_parallel="compressed_gather",
            communication="(P·ceil(n/(P·c)) + c - 1)(d + d_v + 1)"),
        AttentionSpec(
            name="local", fn=sparse.local_attention,
            source="band attention: Parmar et al. 2018 §3.2; LRA's Local Attention "
                   "(Tay et al. 2021)",
            cost="O(nwd)", supports_causal=True, target="softmax", recorded=("window",),
            budget="window", test_budget=8, cached_decode=True, decode="ring_buffer",
            sequence_parallel="halo", communication="2w(d + d_v + 1); causal: w(d + d_v + 1)",
            token_arrays=(("segment_ids", -1, True),)),
        # The linear-recurrent family (spectral_jax.attention.recurrent): exact forms of their
        # own recurrences, each its own target; chunked, with a (d, d_v) state per head.
        AttentionSpec(
            name="gla", fn=recurrent.gla_attention,
            source="Yang et al. 2024 (GLA), eq. 3; chunked form §4",
            cost="O(nCd + nd·d_v)", supports_causal=True, target="gla", state="log_decay",
            layer=(("short_conv_size", None), ("output_gate", "swish")),
            decode="recurrent_state", sequence_parallel="state_prefix",
            communication="P·d(d_v + 1)", grouped_values=True,
            token_arrays=(("g", -3, True), ("segment_ids", -1, True))),
        AttentionSpec(
            name="retnet", fn=recurrent.retnet_attention,
            source="Sun et al. 2023 (RetNet), eq. 1-8 (retention, fixed decay per head)",
            cost="O(nC(d + d_v) + nd·d_v)", supports_causal=True, target="retnet",
            layer=(("short_conv_size", None), ("output_gate", "swish")),
            decode="recurrent_state", sequence_parallel="state_prefix",
            communication="P(d·d_v + 1)", token_arrays=(("segment_ids", -1, True),),
            grouped_values=True),
        AttentionSpec(
            name="mamba2", fn=recurrent.mamba2_attention,
            source="Dao & Gu 2024 (Mamba-2 SSD), eq. 2 and §6",
            cost="O(nC(d + d_v) + nd·d_v)", supports_causal=True, target="mamba2", state="ssd",
            layer=(("short_conv_size", 4), ("output_gate", "swish")),
            decode="recurrent_state", sequence_parallel="state_prefix",
            communication="P(d·d_v + 1)", grouped_values=True,
            token_arrays=(("dt", -2, True), ("segment_ids", -1, True))),
        AttentionSpec(
            name="deltanet", fn=recurrent.deltanet_attention,
            source="Schlag et al. 2021, eq. 29; chunked (UT transform): Yang et al. 2024, §3",
            cost="O(nC(d + d_v) + nd·d_v)", supports_causal=True, target="deltanet",
            state="delta", layer=(("short_conv_size", 4), ("output_gate", "norm")),
            decode="recurrent_state", sequence_parallel="state_prefix",
            communication="P·d(d_v + d)", grouped_values=True,
            token_arrays=(("beta", -2, True), ("segment_ids", -1, True))),
        AttentionSpec(
            name="gated_deltanet", fn=recurrent.gated_deltanet_attention,
            source="Yang, Kautz & Hatamizadeh 2025 (Gated DeltaNet), eq. 10 and §3.3",
            cost="O(nC(d + d_v) + nd·d_v)", supports_causal=True, target="gated_deltanet",
            state="gated_delta", layer=(("short_conv_size", 4), ("output_gate", "swish")),
            decode="recurrent_state", sequence_parallel="state_prefix",
            communication="P·d(d_v + d)", grouped_values=True,
            token_arrays=(("g", -2, True), ("beta", -2, True), ("segment_ids", -1, True))),
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


def methods_where(predicate: Callable[[AttentionSpec], bool]) -> list[str]:
    """The registered names whose entry satisfies ``predicate``, in registry order (the
    lists that error messages offer: "methods that do: [...]").

    Example:
      >>> from spectral_jax.attention._registry import methods_where
      >>> methods_where(lambda spec: spec.state == "random_features")
      ['performer']
    """
    return [name for name, spec in ATTENTIONS.items() if predicate(spec)]


def get_attention_spec(name: str | AttentionSpec) -> AttentionSpec:
    """The :class:`AttentionSpec` registered under ``name``; an entry passes through.

    The name is resolved where it enters (a config, the command line, a layer's
    constructor); from there the entry travels, and the functions that take ``method``
    accept either.

    Raises:
      spectral_jax.UsageError: unknown name; the message lists the known ones.

    Example:
      >>> from spectral_jax.attention import get_attention_spec
      >>> spec = get_attention_spec("performer")
      >>> spec.supports_causal, get_attention_spec(spec) is spec
      (True, True)
    """
    if isinstance(name, AttentionSpec):
        return name
    if not isinstance(name, str) or name not in ATTENTIONS:
        raise UsageError(
            f"Unknown attention {name!r}; known attentions: {', '.join(ATTENTIONS)}."
        )
    return ATTENTIONS[name]


def get_attention(name: str | AttentionSpec) -> Callable[..., object]:
    """The attention function registered under ``name``.

    Args:
      name: one of :func:`available_attentions`, or its :class:`AttentionSpec`.

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
