"""Low-rank projections of the sequence: Linformer's learned length projections and
memory-compressed attention's strided convolution, with the compressed-memory decode form.
"""

from spectral_jax.attention.compressed._linformer import linformer_attention
from spectral_jax.attention.compressed._memory_compressed import (
    mean_pool_conv,
    memory_compressed_attention,
)

__all__ = [
    "linformer_attention",
    "mean_pool_conv",
    "memory_compressed_attention",
]
