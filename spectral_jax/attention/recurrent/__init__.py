"""The linear-recurrent family: GLA, simple GLA, RetNet, Mamba-2 SSD, DeltaNet, Gated
DeltaNet and KDA, one chunked recurrence with every form (parallel, decode, sequence-split).

Each method keeps a (d_k, d_v) state per head, decayed by gates in log space and written
additively or by the delta rule (:mod:`~spectral_jax.attention.recurrent._chunk`). The
functions take ``jax.nn.dot_product_attention``'s layout and fla's / Mamba-2's argument
meanings (see ``docs/methods/recurrent.md``); :func:`recurrent_reference` is their
token-by-token ground truth.
"""

from spectral_jax.attention.recurrent._delta import (
    deltanet_attention,
    gated_deltanet_attention,
    kda_attention,
)
from spectral_jax.attention.recurrent._gla import (
    gla_attention,
    retnet_attention,
    retnet_decays,
    simple_gla_attention,
)
from spectral_jax.attention.recurrent._reference import recurrent_reference, token_step
from spectral_jax.attention.recurrent._ssd import mamba2_attention

__all__ = [
    "deltanet_attention",
    "gated_deltanet_attention",
    "gla_attention",
    "kda_attention",
    "mamba2_attention",
    "recurrent_reference",
    "retnet_attention",
    "retnet_decays",
    "simple_gla_attention",
    "token_step",
]
