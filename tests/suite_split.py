"""Which cases of the registry-wide tests run in the `not slow` suite, and which only in full.

The `not slow` suite (CI's, about 10 minutes on two cores) runs every method through the
float64 references, padding, batch independence, gradients, bfloat16, grouped heads, its
sharded form on 8 devices and every decode form against its causal run
(``tests/test_decode_pure.py``). Tests whose subject is a mechanism shared by the methods run
there for one method per code path that mechanism takes, the first registered method with
each value of the registry field that picks the path: the layers around the methods
(modules, Linen, RoPE, dropout, grouped layers, decoding through models, the grouped sharded
call) and the shared argument handling (sequence lengths and Flax float masks, reduced to
padding by the common prologue; band masks refused; batch-axis masks and collectives of a
split sequence). The full suite (``python -m pytest -n 2``, no ``-m``) runs every method. A
few repeated settings (2 and 4 devices besides 8, multi-query besides grouped-query heads, a
second signal or schedule, the other LRA tasks' smoke runs) are likewise left to it.
"""

from __future__ import annotations

import functools

# Test function -> (its method parameter, the registry field whose value picks the path).
ONE_METHOD_PER_PATH = {
    "test_linen_decoding_equals_the_causal_run": ("name", "decode"),
    "test_prefill_then_steps_equal_full_forward": ("attention", "decode"),
    "test_grouped_prefill_and_steps_equal_the_grouped_and_repeated_causal_runs":
        ("name", "decode"),
    "test_head_chunks_give_the_same_outputs_and_gradients": ("name", "family"),
    "test_grouped_heads_shard_like_one_device": ("name", "sequence_parallel"),
    "test_collectives_do_not_grow_with_the_length": ("name", "sequence_parallel"),
    "test_every_method_gets_rotated_query_and_key_through_the_module": ("name", "family"),
    "test_logits_ignore_padded_content": ("name", "family"),
    "test_pairwise_symmetric_reaches_every_method": ("name", "family"),
    "test_a_grouped_layer_equals_its_repeated_heads": ("name", "family"),
    "test_linen_dropout_applies_or_raises": ("name", "family"),
    "test_flax_causal_mask_with_is_causal_is_its_padding": ("name", "family"),
    "test_every_method_takes_jax_nns_keywords_as_none": ("name", "family"),
    "test_sequence_lengths_and_masks_under_rank_promotion_raise": ("name", "family"),
    "test_seq_lengths_are_an_o_n_padding_mask": ("name", "family"),
    "test_flax_float_masks_equal_boolean_masks": ("name", "family"),
    "test_pure_function_in_nnx_multihead_attention": ("name", "family"),
    "test_token_by_token_decode_equals_the_causal_layer": ("name", "decode"),
    "test_grouped_decoding_keeps_the_key_value_heads_and_equals_the_causal_run":
        ("name", "decode"),
    "test_batch_axis_mask_with_holes_and_lengths_equal_single_device":
        ("name", "sequence_parallel"),
    "test_communication_formula_matches_the_compiled_program": ("name", "sequence_parallel"),
    "test_traced_band_mask_is_never_silent_under_jit": ("name", "family"),
}

# Test function -> (a parameter, the values the `not slow` suite keeps).
KEPT_SETTINGS = {
    "test_sharded_equals_single_device_outputs_and_gradients": ("devices", (8,)),
    "test_grouped_heads_equal_repeated_keys_and_values": ("kv_heads", (2,)),
    "test_signal_saves_the_step_and_resume_is_bit_exact": ("signum", ("SIGTERM",)),
    "test_extend_re_evaluates_a_decaying_schedule_for_the_new_total": ("schedule", ("cosine",)),
    "test_smoke_per_task": ("task", ("text",)),
    # bfloat16 in and out is every method's own test (test_attention_properties); lowering
    # for an accelerator is checked in float32 for every method, bfloat16 in the full suite.
    "test_method_lowers_forward_and_backward": ("dtype", ("float32",)),
    "test_delta_and_output_ignore_padding_and_batch_mates": ("shift", ("paired", "split")),
}


# Whole tests left to the full suite: a second training run that only repeats what another
# test's runs show (the same seed giving the same metrics is also the resume tests'
# reference; each method in its own process is also the sweep test's).
FULL_SUITE_TESTS = frozenset({
    "test_same_seed_same_metrics_and_overwrite",
    "test_sweep_command_runs_each_method_in_its_own_process",
})


@functools.cache
def _representatives(field: str) -> frozenset[str]:
    from spectral_jax.attention import ATTENTIONS

    first: dict[object, str] = {}
    for name, spec in ATTENTIONS.items():
        first.setdefault(getattr(spec, field), name)
    return frozenset(first.values())


def full_suite_only(function: str, params: dict[str, object]) -> bool:
    """Whether the case of test ``function`` with ``params`` runs only in the full suite."""
    if function in FULL_SUITE_TESTS:
        return True
    if function in ONE_METHOD_PER_PATH:
        parameter, field = ONE_METHOD_PER_PATH[function]
        return params[parameter] not in _representatives(field)
    if function in KEPT_SETTINGS:
        parameter, kept = KEPT_SETTINGS[function]
        value = params[parameter]
        # Signals and dtypes compare by name.
        name = getattr(value, "name", None) or getattr(value, "__name__", value)
        return name not in kept
    return False
