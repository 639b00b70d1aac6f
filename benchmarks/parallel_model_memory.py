"""Per-device peak memory of a whole training step's forward and gradients on a split sequence.

A 2-layer Nyströmformer SequenceClassifier (width 64, 32 landmarks) at n = 8192, batch 2,
compiled (nothing runs) on 1 device, on 2 devices (data parallel) and on a (data=2, seq=4)
mesh under ``split_sequence``: whether XLA keeps the layers around attention split over the
sequence too (then the 8-device figure is about 1/8 of the 1-device one).

    python benchmarks/parallel_model_memory.py
"""
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp, optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from spectral_jax.nn import SequenceClassifier, TransformerConfig
from spectral_jax.parallel import split_sequence
from spectral_jax.lra.compiled import peak_bytes
n, b = 8192, 2
cfg = TransformerConfig(vocab_size=11, num_classes=3, max_length=n, num_layers=2, embed_dim=64,
                        num_heads=2, qkv_dim=64, mlp_dim=128, dropout_rate=0.0, attention="nystrom",
                        attention_kwargs=(("num_landmarks", 32),))
model = SequenceClassifier(cfg, rngs=nnx.Rngs(0))
graphdef, params, rest = nnx.split(model, nnx.Param, ...)
def loss(params, ids, mask):
    logits = nnx.merge(graphdef, params, rest)(ids, mask, deterministic=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.zeros(b, int)).mean()
for devices, seq in ((1, 1), (2, 1), (8, 4)):
    mesh = jax.make_mesh((devices // seq, seq), ("data", "seq"), axis_types=(AxisType.Auto,)*2, devices=jax.devices()[:devices])
    def run(params, ids, mask):
        if seq == 1:
            return jax.value_and_grad(loss)(params, ids, mask)
        with split_sequence(mesh, batch_axis="data"):
            return jax.value_and_grad(loss)(params, ids, mask)
    with jax.set_mesh(mesh):
        bs = NamedSharding(mesh, P("data"))
        ids = jax.ShapeDtypeStruct((b, n), jnp.int32, sharding=bs)
        mask = jax.ShapeDtypeStruct((b, n), bool, sharding=bs)
        rep = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())), params)
        c = jax.jit(run).lower(rep, ids, mask).compile()
        print(devices, seq, f"{peak_bytes(c) / 2**20:.1f} MiB per device")
