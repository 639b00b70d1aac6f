"""The program readers of `benchmarks/`: `op_profile.py` sorts compiled HLO operations by
kind and counts each matmul's FLOP; `program_size_by_line.py` charges StableHLO ops to the
source lines that emit them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]


def _op_profile():
    spec = importlib.util.spec_from_file_location("op_profile",
                                                  ROOT / "benchmarks/op_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kinds(fn, *args):
    op = _op_profile()
    instrs, comps = op.parse_hlo(jax.jit(fn).lower(*args).compile().as_text())
    entry = [name for name, i in instrs.items() if i["opcode"] in ("dot", "fusion", "copy",
                                                                      "transpose")]
    return {op.classify(name, instrs, comps) for name in entry}


def test_matmuls_are_told_apart_by_their_contraction_and_counted():
    a = jnp.ones((512, 16))
    b = jnp.ones((16, 16))
    # (512, 16) @ (16, 16): the contraction (16) is short beside the 512 output rows.
    assert ("matmul", 2.0 * 512 * 16 * 16) in _kinds(lambda a, b: a @ b, a, b)
    # (16, 512) @ (512, 16): a reduction over the 512 rows into a 16 × 16 matrix.
    assert ("long matmul", 2.0 * 512 * 16 * 16) in _kinds(lambda a: a.T @ a, a)


def test_elementwise_and_data_movement_are_told_apart():
    x = jnp.ones((64, 48))
    assert _kinds(lambda x: jnp.exp(x) * 2.0, x) == {("elementwise", 0.0)}
    assert _kinds(lambda x: jnp.concatenate([x.T, x.T]), x) == {("data movement", 0.0)}


def test_program_size_charges_ops_to_the_lines_that_emit_them():
    spec = importlib.util.spec_from_file_location(
        "program_size_by_line", ROOT / "benchmarks/program_size_by_line.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counts, instructions = module.program_size("nystrom", batch=1, length=128, heads=1,
                                               head_dim=8)
    assert instructions > 0
    # The three segment means, the pseudo-inverse and the kernels are Nyström's own lines.
    assert any(where.startswith("attention/core/_landmarks.py") for where in counts)
    assert any(where.startswith("attention/landmark/_pinv.py") for where in counts)
    assert sum(counts.values()) > counts["?"] > 0
    # A method with a random state (gates) is counted with it, as `bench speed` runs it.
    gated, _ = module.program_size("gated_linear", batch=1, length=16, heads=1, head_dim=8)
    assert any(where.startswith("attention/kernel/_gated_linear.py") for where in gated)


def test_batched_matmuls_count_their_batch_and_contraction():
    a = jnp.ones((4, 256, 8))
    # (4, 8, 256) @ (4, 256, 8): per batch a reduction over 256 rows into an 8 × 8 matrix.
    kinds = _kinds(lambda a: jnp.einsum("bnd,bne->bde", a, a), a)
    assert ("long matmul", 2.0 * 4 * 8 * 8 * 256) in kinds


def test_the_table_leaves_an_absent_kind_blank_and_sets_async_dots_apart():
    op = _op_profile()
    from spectral_jax.lra.bench import roofline

    rates = roofline.MachineRates(100.0, 2048, 80.0, (8, 4), 10.0, 256)
    row = {"method": "m", "length": 8, "wall_s": 1.0, "xla_gflop": 50.0, "xla_gbyte": 2.0,
           "seconds": {"matmul": 0.4, "long matmul": 0.0, "elementwise": 0.3,
                       "data movement": 0.2, "other": 0.0, "async": 0.1},
           "gflop_by_kind": {"matmul": 20.0, "long matmul": 0.0, "async": 5.0}}
    env = {"time": "t", "jax": "j", "cpu_count": 2, "load_average": "0"}
    line = op.markdown([row], rates, {"matmul": 100.0, "long matmul": 50.0}, env
                       ).splitlines()[-1]
    # shares 40/0/30/20 and 10% async; matmul 20 GFLOP in 0.4 s = 50 GFLOP/s, half its
    # shape's 100; no long matmul; bound 50/100 + 2/10 = 0.7 s of the 1 s wall.
    assert line == ("| m | 1000.0 | 1000.0 | 40% | 0% | 30% | 20% | 10% | 50.0 (50%) | — "
                    "| 700.0 | 70% |")
