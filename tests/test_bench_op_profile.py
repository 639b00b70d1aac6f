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
    assert ("long matmul", 2.0 * 512 * 16 * 16) in _kinds(lambda a, b: a.T @ a, a, b)


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
