"""Learned state summaries: inducing points (Set Transformer) and Luna's packed sequence,
where a few learned rows attend to the sequence and the queries read them back.
"""

from spectral_jax.attention.summary._inducing_points import inducing_points_attention
from spectral_jax.attention.summary._luna import luna_attention, luna_pack

__all__ = [
    "inducing_points_attention",
    "luna_attention",
    "luna_pack",
]
