"""Nyström and spectral shift with ``pinv_init="global"``: the reference code's one
Z_0 scale over the batch, its gradient in float64, and inside ``shard_map``."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spectral_jax.attention as sa


def _nystrom_global_direct(q, k, v, num_landmarks, iterations):
    """Nyströmformer as the reference code writes it: whole (batch, heads, ...) tensors, one
    Z_0 scale = max of all column sums x max of all row sums. No padding, n divisible by m."""
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # (B, H, n, d)
    b, h, n, d = q.shape
    q = q / np.sqrt(d)
    means = lambda x: x.reshape(b, h, num_landmarks, n // num_landmarks, d).mean(3)  # noqa: E731
    q_lm, k_lm = means(q), means(k)
    t = lambda x: jnp.swapaxes(x, -1, -2)  # noqa: E731
    f = jax.nn.softmax(q @ t(k_lm), axis=-1)
    a = jax.nn.softmax(q_lm @ t(k_lm), axis=-1)
    b_kernel = jax.nn.softmax(q_lm @ t(k), axis=-1)
    z = t(a) / (jnp.abs(a).sum(-2).max() * jnp.abs(a).sum(-1).max())
    eye = jnp.eye(num_landmarks)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return jnp.swapaxes(f @ (z @ (b_kernel @ v)), 1, 2)


GLOBAL_METHODS = {
    "nystrom": functools.partial(sa.nystrom_attention, num_landmarks=4, pinv_init="global"),
    "spectral_shift": functools.partial(sa.spectral_shift_attention, num_landmarks=4,
                                        pinv_init="global", shift="zero"),
}


@pytest.mark.parametrize("name", GLOBAL_METHODS)
def test_global_pinv_init_gradient_matches_direct_float64(name):
    # The reference differentiates through its max (torch.max sends the gradient to the
    # maximising entry), and so does this: the gradient includes the scale's.
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.key(0), 4)
        q, k, v = (2.0 * jax.random.normal(kk, (3, 16, 2, 4), jnp.float64) for kk in keys[:3])
        w = jax.random.normal(keys[3], (3, 16, 2, 4), jnp.float64)
        fn = GLOBAL_METHODS[name]
        ref = functools.partial(_nystrom_global_direct, num_landmarks=4, iterations=6)
        grad = lambda f: jax.grad(lambda q, k, v: jnp.sum(w * f(q, k, v)), (0, 1, 2))  # noqa: E731

        @jax.jit
        def outputs_and_grads(q, k, v):
            chunked = functools.partial(fn, head_chunk_size=1)  # one (example, head) per step
            return ((fn(q, k, v), grad(fn)(q, k, v), grad(chunked)(q, k, v)),
                    (ref(q, k, v), grad(ref)(q, k, v), grad(ref)(q, k, v)))

        got, want = outputs_and_grads(q, k, v)
        chex.assert_trees_all_close(got, want, rtol=1e-9, atol=1e-11)


def test_global_pinv_init_trains_inside_shard_map():
    # Inside shard_map (check_vma=True) the scale is taken over each device's examples, as
    # the PyTorch code does under data parallelism.
    x = jax.random.normal(jax.random.key(1), (2, 16, 2, 4))
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.PartitionSpec("data")
    fns = [GLOBAL_METHODS["nystrom"],
           functools.partial(GLOBAL_METHODS["spectral_shift"], shift="paired")]
    sharded = [jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                             check_vma=True) for fn in fns]
    per_device = [lambda q, k, v, fn=fn: jnp.concatenate(
        [fn(q[i:i + 1], k[i:i + 1], v[i:i + 1]) for i in range(2)]) for fn in fns]
    value_and_grad = lambda f: jax.value_and_grad(lambda x: jnp.sum(jnp.sin(f(x, x, x))))  # noqa: E731
    with jax.set_mesh(mesh):
        got = jax.jit(lambda x: [value_and_grad(f)(x) for f in sharded])(x)
    want = jax.jit(lambda x: [value_and_grad(f)(x) for f in per_device])(x)
    chex.assert_trees_all_close(got, want, atol=1e-5)
    assert all(bool(jnp.isfinite(g).all()) for _, g in got)
