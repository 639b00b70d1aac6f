"""Every registered method, a training step and a decode step lower for GPU and TPU.

``jax.export`` lowers for platforms this machine does not have (lowering only, nothing is
compiled), so a CUDA or TPU lowering error shows up here without an accelerator. Both
platforms are lowered in one export call.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest
from attention_cases import method_kwargs, padding_mask, qkv
from flax import nnx

from spectral_jax.attention import (
    ATTENTIONS,
    get_attention_spec,
    resolve_head_chunk_size,
    softmax_attention,
)

PLATFORMS = ("cuda", "tpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _export(fn, *args, platforms=PLATFORMS):
    return jax.export.export(jax.jit(fn), platforms=platforms)(*args)


def _causal_modes(name):
    spec = get_attention_spec(name)
    if spec.causal_only:
        return (True,)
    return (False, True) if spec.supports_causal else (False,)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", tuple(ATTENTIONS))
def test_method_lowers_forward_and_backward(name, dtype):
    spec = get_attention_spec(name)
    q, k, v = qkv(0, (2, 48, 2, 8), dtype)
    mask = padding_mask(jnp.arange(48)[None] < jnp.array([48, 30])[:, None])
    kwargs = method_kwargs(name, n=48, head_dim=8)
    for causal in _causal_modes(name):
        def forward(q, k, v, causal=causal):
            out = spec.fn(q, k, v, mask=mask, is_causal=causal, **kwargs)
            return out[0] if isinstance(out, tuple) else out

        def forward_backward(q, k, v):
            def loss(*a):
                return jnp.sum(forward(*a).astype(jnp.float32) ** 2)

            return forward(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

        exported = _export(forward_backward, q, k, v)
        assert exported.platforms == PLATFORMS
        out, grads = exported.out_tree.unflatten(exported.out_avals)
        assert out.shape == q.shape and out.dtype == dtype
        assert [g.shape for g in grads] == [q.shape] * 3 and all(g.dtype == dtype for g in grads)


def test_cpu_head_chunking_stays_out_of_accelerator_programs():
    # 8 slices of n = 4096: on CPU resolve_head_chunk_size picks one slice per step, a
    # jax.lax.map loop (a stablehlo.while); GPU/TPU programs vmap all slices at once.
    assert resolve_head_chunk_size("nystrom", None, 8, 4096, platform="cpu") == 1
    assert resolve_head_chunk_size("nystrom", None, 8, 4096, platform="cuda") == 8
    assert resolve_head_chunk_size("nystrom", None, 8, 4096, platform="tpu") == 8
    x = jax.ShapeDtypeStruct((1, 4096, 8, 8), jnp.float32)
    fn = get_attention_spec("nystrom").fn

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v, num_landmarks=8) ** 2)

    step = jax.value_and_grad(loss, argnums=(0, 1, 2))

    def loops(program) -> int:  # the pseudo-inverse's own loops are in every program
        return program.mlir_module().count("stablehlo.while")

    def all_at_once(q, k, v):
        return jnp.sum(fn(q, k, v, num_landmarks=8, head_chunk_size=8) ** 2)

    vmapped = loops(_export(jax.value_and_grad(all_at_once, argnums=(0, 1, 2)), x, x, x))
    assert loops(_export(step, x, x, x)) == vmapped
    assert loops(_export(step, x, x, x, platforms=("cpu",))) > vmapped
    # On CPU the lowering-time choice is the loop itself: bitwise the explicit one slice
    # per step.
    q, k, v = qkv(0, (1, 4096, 8, 8))
    auto = jax.jit(step)(q, k, v)
    one = jax.jit(jax.value_and_grad(
        lambda *a: jnp.sum(fn(*a, num_landmarks=8, head_chunk_size=1) ** 2),
        argnums=(0, 1, 2)))(q, k, v)
    assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(auto), jax.tree.leaves(one)))
    # An explicit chunk size is honoured on every platform.
    def chunked(q, k, v):
        return fn(q, k, v, num_landmarks=8, head_chunk_size=2)

    assert loops(_export(chunked, x, x, x)) > loops(_export(
        lambda q, k, v: fn(q, k, v, num_landmarks=8, head_chunk_size=8), x, x, x))


def test_quick_listops_train_step_lowers():
    from spectral_jax.lra.bench.compile import train_step_program
    from spectral_jax.lra.train.overrides import load_config

    config = load_config("lra/listops:quick")
    program = train_step_program(config)
    exported = jax.export.export(program.step, platforms=PLATFORMS)(*program.args)
    metrics = exported.out_tree.unflatten(exported.out_avals)[1]
    assert metrics["loss_sum"].shape == () and metrics["finite"].dtype == jnp.bool_
    assert exported.platforms == PLATFORMS


def test_softmax_decode_step_lowers():
    layer = nnx.MultiHeadAttention(num_heads=2, in_features=16, qkv_features=16, decode=True,
                                   attention_fn=softmax_attention, rngs=nnx.Rngs(0))
    layer.init_cache((2, 8, 16))
    graphdef, state = nnx.split(layer)

    def decode(state, token):
        module = nnx.merge(graphdef, state)
        out = module(token)
        return out, nnx.state(module)

    token = jnp.ones((2, 1, 16))
    exported = _export(decode, state, token)
    out, new_state = exported.out_tree.unflatten(exported.out_avals)
    assert out.shape == (2, 1, 16)
    assert [x.shape for x in jax.tree.leaves(new_state["cache_index"])] == [()]
