"""Faults found by using the library as its users would (issue 15), each pinned by its input."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spectral_jax.attention as sa


# --- pinv_init="global" is differentiable and matches the reference formula --------------

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
    # Issue 15.2: jax.grad raised "Differentiation rule for 'pmax' not implemented". The
    # reference differentiates through its max (torch.max sends the gradient to the
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


# --- causal Performer's backward pass never holds the (n, r) features ------------------

def _causal_performer_grad_temp_bytes(n, num_features, head_dim):
    q = jax.ShapeDtypeStruct((1, n, 1, head_dim), jnp.float32)
    w = sa.orthogonal_random_features(jax.random.key(1), num_features, head_dim)
    loss = lambda q, k, v: sa.performer_attention(q, k, v, projection=w, is_causal=True).sum()  # noqa: E731
    compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, q, q).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_causal_performer_backward_memory():
    # Issue 15.3: 84 MiB of temporaries, about 10.5 (n, r) float32 arrays, when the
    # features were built before the chunked scan; computed per chunk it is 13 MiB.
    assert _causal_performer_grad_temp_bytes(8192, 256, 64) <= 16 * 2**20
    # With a small head_dim the O(n·d) inputs no longer hide the feature term: less than one
    # (n, r) float32 array in all (it was 9.7 of them).
    n, r = 4096, 256
    assert _causal_performer_grad_temp_bytes(n, r, 8) < n * r * 4


def test_causal_feature_scan_gradient_matches_one_chunk():
    # The chunked, rematerialised scan gives the dense lower-triangular form's gradient
    # (one chunk covering every token), float64, with padding and a length (50) that 16
    # does not divide.
    with jax.enable_x64(True):
        q, k, v = jax.random.normal(jax.random.key(3), (3, 2, 50, 2, 8), jnp.float64)
        w = sa.orthogonal_random_features(jax.random.key(4), 32, 8, dtype=jnp.float64)
        lengths = jnp.array([50, 37])
        methods = [functools.partial(sa.performer_attention, projection=w),
                   functools.partial(sa.linear_attention)]

        @jax.jit
        def grads(q, k, v):
            out = []
            for fn in methods:
                for chunk in (16, 64):
                    loss = lambda q, k, v, fn=fn, chunk=chunk: jnp.sum(jnp.cos(fn(  # noqa: E731
                        q, k, v, is_causal=True, chunk_size=chunk,
                        key_value_seq_lengths=lengths, query_seq_lengths=lengths)))
                    out.append(jax.grad(loss, (0, 1, 2))(q, k, v))
            return out

        g = grads(q, k, v)
        chex.assert_trees_all_close(g[0], g[1], rtol=1e-9, atol=1e-10)
        chex.assert_trees_all_close(g[2], g[3], rtol=1e-9, atol=1e-10)
        assert float(jnp.abs(g[0][1][1, 37:]).max()) == 0.0  # padded keys get no gradient


# --- static parameters traced by jit say how to keep them static -----------------------

def _static_cases():
    """Every keyword parameter with a number or bool default, of every method."""
    import inspect
    cases = []
    for name in sa.available_attentions():
        for param in inspect.signature(sa.get_attention(name)).parameters.values():
            if param.kind is param.KEYWORD_ONLY and type(param.default) in (int, float, bool):
                cases.append((name, param.name, param.default))
        if name != "softmax":
            cases.append((name, "head_chunk_size", 1))
    cases.append(("symmetric", "shift", True))
    cases.append(("symmetric", "num_landmarks", 4))
    return cases


@pytest.mark.parametrize(("name", "param", "value"), _static_cases())
def test_traced_static_parameter_says_how_to_keep_it_static(name, param, value):
    # Issue 15.9: jax.jit(nystrom_attention)(q, k, v, num_landmarks=32) said "must be a
    # positive int; got JitTracer(...)".
    from attention_cases import method_kwargs
    x = jnp.ones((1, 16, 2, 8))
    if name == "symmetric":
        fn, kwargs = sa.symmetric_spectral_shift_attention, {}
    else:
        fn, kwargs = sa.get_attention(name), method_kwargs(name, n=16, head_dim=8)
    kwargs.pop(param, None)
    call = jax.jit(lambda x, value: fn(x, x, x, **kwargs, **{param: value}))
    method = fn.__name__
    with pytest.raises(TypeError, match=(
            rf"{method}\(\): `{param}` must be a static Python value, but it is traced .*"
            rf"functools.partial\({method}, {param}=...\).*static_argnames=\('{param}',\)")):
        call(x, value)


def test_traced_num_landmarks_issue_input():
    q = jnp.ones((1, 64, 2, 8))
    with pytest.raises(TypeError, match=r"`num_landmarks` must be a static Python value.*"
                                        r"functools.partial.*static_argnames"):
        jax.jit(sa.nystrom_attention)(q, q, q, num_landmarks=32)
    # ... and the ways it names work.
    want = sa.nystrom_attention(q, q, q, num_landmarks=32)
    chex.assert_trees_all_close(
        jax.jit(functools.partial(sa.nystrom_attention, num_landmarks=32))(q, q, q), want)
    chex.assert_trees_all_close(
        jax.jit(sa.nystrom_attention, static_argnames=("num_landmarks",))(
            q, q, q, num_landmarks=32), want)


# --- softmax_attention's dropout: errors name it, a traced rate works -------------------

def test_softmax_dropout_errors_name_softmax_attention():
    x = jnp.ones((1, 8, 2, 4))
    rng = jax.random.key(0)
    for rate, match in ((1.5, r"must be in \[0, 1\); got 1.5"), (-0.1, "must be a finite float >= 0")):
        with pytest.raises(ValueError, match=rf"^softmax_attention\(\): `dropout_rate` {match}"):
            sa.softmax_attention(x, x, x, dropout_rate=rate, dropout_rng=rng, deterministic=False)
    with pytest.raises(ValueError, match=r"^softmax_attention\(\): dropout_rate=0.5 .*`dropout_rng`"):
        sa.softmax_attention(x, x, x, dropout_rate=0.5, deterministic=False)


def test_softmax_dropout_rate_traced_under_jit():
    # Issue 15.11: a traced rate gave TracerBoolConversionError. It is a probability for
    # jax.random.bernoulli, so it works, giving what the same concrete rate gives.
    x = jax.random.normal(jax.random.key(1), (2, 8, 2, 4))
    rng = jax.random.key(2)
    call = lambda rate: sa.softmax_attention(  # noqa: E731
        x, x, x, dropout_rate=rate, dropout_rng=rng, deterministic=False)
    traced = jax.jit(call)
    chex.assert_trees_all_close(traced(jnp.float32(0.5)), call(0.5), atol=1e-6)
    chex.assert_trees_all_close(traced(jnp.float32(0.0)), sa.softmax_attention(x, x, x),
                                atol=1e-6)
    # The approximate methods have no weight dropout: a traced rate may be nonzero, so it
    # is refused as a concrete nonzero rate is.
    with pytest.raises(NotImplementedError, match=r"nystrom_attention\(\): attention-weight dropout"):
        jax.jit(lambda r: sa.nystrom_attention(x, x, x, num_landmarks=4, dropout_rate=r))(0.1)


# --- a step directory with partial content is not the latest checkpoint ----------------

@pytest.mark.parametrize("remove", ["meta", "state/_METADATA"])
def test_incomplete_checkpoint_is_skipped_with_a_warning(tmp_path, remove):
    import shutil

    from flax import nnx

    from spectral_jax.lra.train.checkpoint import Checkpointer
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    ckpt = Checkpointer(str(tmp_path), keep=3)
    for step in (2, 4):
        ckpt.save(step, jax.tree.map(lambda x, s=step: x + s, state), {"step": step}, 0.1 * step)
    ckpt.close()
    target = tmp_path / "4" / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    # Issue 15.7: resuming took step 4 and failed with KeyError 'Item "meta" was not found'.
    with pytest.warns(UserWarning, match=rf"checkpoint directory {tmp_path}/4 is incomplete "
                                         rf"\(missing {remove}.*moved to {tmp_path}/4.incomplete"):
        ckpt = Checkpointer(str(tmp_path), keep=3)
    assert ckpt.latest_step() == 2
    restored, meta = ckpt.restore(2, state)
    assert meta == {"step": 2}
    chex.assert_trees_all_close(nnx.to_pure_dict(restored),
                                nnx.to_pure_dict(jax.tree.map(lambda x: x + 2, state)))
    ckpt.save(4, state, {"step": 4}, 0.4)  # the step is saved again, no collision
    ckpt.close()
    reopened = Checkpointer(str(tmp_path), keep=3)
    assert reopened.latest_step() == 4
    reopened.close()
    assert (tmp_path / "4.incomplete").is_dir()


# --- the best checkpoint survives a resume ------------------------------------------------

@pytest.mark.parametrize("metrics_on_disk", [True, False])
def test_best_checkpoint_survives_reopening(tmp_path, metrics_on_disk):
    import shutil

    from flax import nnx

    from spectral_jax.lra.train.checkpoint import Checkpointer
    state = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    ckpt = Checkpointer(str(tmp_path), keep=1)
    for step, accuracy in ((1, 0.9), (2, 0.1)):
        ckpt.save(step, state, {"step": step}, accuracy)
    ckpt.close()
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [1, 2]
    if not metrics_on_disk:  # as written before the metrics were saved
        for step in (1, 2):
            shutil.rmtree(tmp_path / str(step) / "metrics")
    # A resumed run used to forget every metric, so its first save deleted step 1, the best,
    # and the final test evaluation of the best checkpoint then failed.
    reopened = Checkpointer(str(tmp_path), keep=1)
    for step, accuracy in ((3, 0.2), (4, 0.3)):
        reopened.save(step, state, {"step": step}, accuracy)
    reopened.close()
    kept = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert kept == ([1, 4] if metrics_on_disk else [1, 2, 4])
    _, meta = Checkpointer(str(tmp_path), keep=1).restore(1, state)
    assert meta == {"step": 1}


# --- loading Path-X warns once about the release's known fault --------------------------

def test_pathx_warns_once_naming_lra_issue_38(tmp_path, monkeypatch):
    import warnings

    from spectral_jax.lra.data import pathfinder
    pathfinder.generate(tmp_path, resolution=128, num_images=2, seed=0)
    monkeypatch.setattr(pathfinder, "_warned_pathx", False)
    with pytest.warns(UserWarning, match=r"pathfinder128.*long-range-arena issue #38"):
        task = pathfinder.load(tmp_path, resolution=128, name="pathx")
    assert task.splits["train"].inputs.shape[1] == 128 * 128
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: not again
        pathfinder.load(tmp_path, resolution=128, name="pathx")
        pathfinder.generate(tmp_path / "small", resolution=32, num_images=2, seed=0)
        pathfinder.load(tmp_path / "small", resolution=32)  # 32x32 never warns
