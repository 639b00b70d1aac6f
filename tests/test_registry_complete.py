"""Every registered attention method has what the rest of the library derives from its entry."""

from __future__ import annotations

import functools
import inspect

import attention_cases
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectral_jax.attention import ATTENTIONS, STATE_KINDS
from spectral_jax.lra.train import config_lib
from spectral_jax.nn import STATE_MODULES, module_options


def _problems(name: str) -> list[str]:
    spec = ATTENTIONS[name]
    params = inspect.signature(spec.fn).parameters
    problems = []
    if spec.name != name:
        problems.append(f"registered under {name!r} but its spec says name={spec.name!r}")
    for field in ("source", "cost"):
        if not getattr(spec, field).strip():
            problems.append(f"empty `{field}` (the README table needs it)")
    for arg in ("query", "key", "value", "bias", "mask", "scale", "is_causal"):
        if arg not in params:
            problems.append(f"fn {spec.fn.__name__} lacks the standard parameter {arg!r}")
    target = ATTENTIONS.get(spec.target)
    if target is None or not target.exact:
        problems.append(f"target {spec.target!r} is not a registered exact method")
    if spec.causal_only and not spec.supports_causal:
        problems.append("a causal-only method (fn defaults to is_causal=True) must support "
                        "is_causal=True")
    kind = spec.state_kind if spec.state in STATE_KINDS else None
    if spec.state is not None:
        if kind is None:
            problems.append(f"state {spec.state!r} is not a kind in STATE_KINDS")
        elif spec.state not in STATE_MODULES:
            problems.append(f"state kind {spec.state!r} has no module in nn.STATE_MODULES")
        else:
            missing = [a for a in kind.arguments if a not in params]
            if missing:
                problems.append(f"state {spec.state!r} fills {missing}, not parameters of fn")
    kind_options = kind.options if kind is not None else {}
    if spec.budget is not None:
        if spec.budget not in params and spec.budget not in kind_options:
            problems.append(f"budget {spec.budget!r} is neither a parameter of fn nor an "
                            "option of its state kind")
        if spec.budget not in spec.recorded:
            problems.append(f"budget {spec.budget!r} is not among the recorded parameters")
        if not isinstance(spec.test_budget, int) or spec.test_budget < 1:
            problems.append("a method with a budget needs a positive `test_budget`")
    for param in spec.recorded:
        try:
            spec.default(param)
        except KeyError as err:
            problems.append(str(err.args[0]))
    doc = spec.fn.__doc__ or ""
    if "Args:" in doc and "the rest: as" not in doc:  # else it defers to another function
        args = doc[doc.index("Args:"):doc.index("Returns:")]
        own = set(params) - getattr(spec.fn, "drop_in_added", frozenset())  # Flax's keywords
        problems += [f"its docstring's Args lack {arg!r}" for arg in sorted(own)
                     if arg not in args]
    return problems


@pytest.mark.parametrize("name", tuple(ATTENTIONS))
def test_registered_method_is_complete(name):
    problems = _problems(name)
    assert not problems, f"attention {name!r}: " + "; ".join(problems)


@pytest.mark.parametrize("name", tuple(ATTENTIONS))
def test_everything_derives_from_the_entry(name):
    spec = ATTENTIONS[name]
    defaults = config_lib.attention_kwargs(name)
    assert defaults == spec.config_defaults()
    assert set(defaults) <= set(module_options(name)) | set(
        inspect.signature(spec.fn).parameters)
    kw = attention_cases.method_kwargs(name, n=16, head_dim=4)
    assert set(kw) <= set(inspect.signature(spec.fn).parameters)
    if spec.state_kind is not None:
        state = spec.make_state(jax.random.key(0), budget=spec.test_budget, length=16,
                                head_dim=4)
        assert set(state) and set(state) <= set(spec.state_kind.arguments)


def test_every_state_kind_has_a_module():
    assert set(STATE_KINDS) == set(STATE_MODULES), (
        "each state kind in spectral_jax.attention.STATE_KINDS needs a module in "
        "spectral_jax.nn.STATE_MODULES (and no module without a kind)")


@pytest.mark.parametrize("target", sorted({s.target for s in ATTENTIONS.values()}))
def test_every_target_is_a_float64_reference(target):
    # The tests compare each approximation with its target computed in float64.
    assert target in ATTENTIONS and ATTENTIONS[target].exact, (
        f"target {target!r} must be a registered exact method")
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 6, 1, 4)))
        # A recurrent method is its own target: its gates come from the registry's state.
        state = attention_cases.method_kwargs(target, n=6, head_dim=4)
        out = jax.jit(functools.partial(ATTENTIONS[target].fn, **state))(x, x, x)
        assert out.dtype == jnp.float64, f"target {target!r} does not compute in float64"
        assert bool(jnp.all(jnp.isfinite(out)))
