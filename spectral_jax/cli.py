"""The `spectral-jax` command: one entry point, one subcommand per concern.

Each subcommand lives next to the code it drives and registers itself through a
`add_parser(subparsers)` function that sets `func` on its parser; this file only
dispatches, so importing it stays cheap (JAX is imported by the subcommands).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines `add_parser(subparsers)`.
_SUBCOMMANDS = {
    "train": "spectral_jax.train.cli",
    "eval": "spectral_jax.train.cli",
    "table": "spectral_jax.train.cli",
    "sweep": "spectral_jax.train.sweep_cli",
    "data": "spectral_jax.data.cli",
    "bench": "spectral_jax.bench.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectral-jax",
        description="Efficient attention in JAX: LRA training, data and benchmarks.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in dict.fromkeys(_SUBCOMMANDS.values()):
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
