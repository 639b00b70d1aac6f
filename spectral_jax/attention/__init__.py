"""Attention methods as pure JAX functions, in ``jax.nn.dot_product_attention``'s layout.

Every function takes ``(query, key, value, bias=None, mask=None, *, scale=None,
is_causal=False, <method parameters>)`` with arrays shaped ``(batch..., length, heads,
head_dim)`` and plugs into Flax's ``attention_fn``. Pick one by name with
:func:`get_attention`.
"""

from spectral_jax.attention._decode import (
    DECODE_FORMS,
    DecodeState,
    decode_methods,
    init_decode_state,
    prefill,
)
from spectral_jax.attention._decode_step import check_decode_state, decode_step
from spectral_jax.attention._registry import (
    ATTENTIONS,
    BASELINE,
    AttentionSpec,
    available_attentions,
    budget_parameters,
    get_attention,
    get_attention_spec,
)
from spectral_jax.attention._state import LINFORMER_SHARING, STATE_KINDS, StateKind
from spectral_jax.attention.compressed import (
    linformer_attention,
    mean_pool_conv,
    memory_compressed_attention,
)
from spectral_jax.attention.core._common import FLAX_KWARGS, resolve_head_chunk_size
from spectral_jax.attention.core._hints import cached_decode_hint, causal_methods_hint
from spectral_jax.attention.core._landmarks import segment_means
from spectral_jax.attention.core._padding import as_bool_mask
from spectral_jax.attention.core._segments import positions as segment_positions
from spectral_jax.attention.core._shard_form import SHARD_FORMS
from spectral_jax.attention.exact import (
    kernelized_attention,
    reference_attention,
    softmax_attention,
)
from spectral_jax.attention.kernel import (
    gated_linear_attention,
    linear_attention,
    orthogonal_random_features,
    performer_attention,
)
from spectral_jax.attention.landmark import (
    iterative_pinv,
    nystrom_attention,
    skyformer_attention,
    spectral_shift_attention,
    spectral_shift_delta,
    symmetric_spectral_shift_attention,
)
from spectral_jax.attention.recurrent import (
    deltanet_attention,
    gated_deltanet_attention,
    gla_attention,
    kda_attention,
    mamba2_attention,
    retnet_attention,
    simple_gla_attention,
)
from spectral_jax.attention.sparse import (
    clustered_attention,
    improved_clustered_attention,
    local_attention,
    probsparse_attention,
)
from spectral_jax.attention.summary import inducing_points_attention, luna_attention, luna_pack

__all__ = [
    "ATTENTIONS",
    "AttentionSpec",
    "BASELINE",
    "DECODE_FORMS",
    "DecodeState",
    "FLAX_KWARGS",
    "LINFORMER_SHARING",
    "SHARD_FORMS",
    "STATE_KINDS",
    "StateKind",
    "as_bool_mask",
    "available_attentions",
    "budget_parameters",
    "cached_decode_hint",
    "causal_methods_hint",
    "check_decode_state",
    "clustered_attention",
    "decode_methods",
    "decode_step",
    "deltanet_attention",
    "gated_deltanet_attention",
    "gated_linear_attention",
    "get_attention",
    "get_attention_spec",
    "gla_attention",
    "improved_clustered_attention",
    "inducing_points_attention",
    "init_decode_state",
    "iterative_pinv",
    "kda_attention",
    "kernelized_attention",
    "linear_attention",
    "linformer_attention",
    "local_attention",
    "luna_attention",
    "luna_pack",
    "mamba2_attention",
    "mean_pool_conv",
    "memory_compressed_attention",
    "nystrom_attention",
    "orthogonal_random_features",
    "performer_attention",
    "prefill",
    "probsparse_attention",
    "reference_attention",
    "resolve_head_chunk_size",
    "retnet_attention",
    "segment_means",
    "segment_positions",
    "simple_gla_attention",
    "skyformer_attention",
    "softmax_attention",
    "spectral_shift_attention",
    "spectral_shift_delta",
    "symmetric_spectral_shift_attention",
]
