"""The floor every family stands on: argument checks, masks, padding and segment ids, the
per-head lift, the sequence reductions that become collectives on a split sequence, ring
passes, landmark segment means, and the types of decode and shard forms.

Nothing here names a method; every family imports from here and nothing here imports a
family. The registry and the decode driver stand above the families
(:mod:`spectral_jax.attention`).
"""

