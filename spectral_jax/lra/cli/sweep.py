"""``spectral-jax sweep``: the command-line side of :mod:`spectral_jax.lra.train.sweep`."""

from __future__ import annotations

import argparse
import sys

from spectral_jax.lra.train.sweep import parse_methods, run_sweep


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``sweep`` on the ``spectral-jax`` dispatcher."""
    from spectral_jax.lra.cli.train import _accept_config_overrides

    sweep = subparsers.add_parser(
        "sweep", help="train and tabulate every (method, seed) of a config",
        description="Trains and evaluates each (method, seed) pair in DIR/<method>-seed<k>, "
        "skipping finished runs and resuming interrupted ones; a failed run is recorded with "
        "its reason and the others go on. Writes DIR/table.md, DIR/table.json and "
        "DIR/accuracy_vs_throughput.png (the same as `spectral-jax table DIR/*`). Extra "
        "--config.FIELD=VALUE arguments override config fields of every run.",
    )
    sweep.add_argument("--config", required=True,
                       help="NAME|FILE.py[:ARG], e.g. lra/image:quick (no attention=)")
    sweep.add_argument("--attention", required=True,
                       help="comma-separated registry names, or 'all'")
    sweep.add_argument("--seeds", nargs="+", type=int, default=[0])
    sweep.add_argument("--workdir", required=True, help="the sweep folder")
    sweep.add_argument("--in-process", action="store_true",
                       help="train in this process instead of one process per run")
    sweep.add_argument("--overwrite", action="store_true",
                       help="replace run folders that hold a run with a different config")
    sweep.set_defaults(func=_sweep, config_overrides=[])
    _accept_config_overrides(sweep)


def _sweep(args: argparse.Namespace) -> int:
    try:
        methods = parse_methods(args.attention)
        summary = run_sweep(args.config, methods, args.seeds, args.workdir,
                            args.config_overrides, in_process=args.in_process,
                            overwrite=args.overwrite)
    except KeyboardInterrupt as e:
        print(str(e) or "\nsweep interrupted; the same command resumes it", file=sys.stderr)
        return getattr(e, "exit_status", 130)
    return 0 if all(r["status"] != "failed" for r in summary["runs"]) else 1
