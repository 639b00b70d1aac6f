"""``spectral-jax train | config | eval | table``: the training subcommands.

    spectral-jax train --config lra/listops:quick --workdir runs/listops_quick
    spectral-jax train --config lra/text:attention=nystrom,protocol=small \\
        --config.train.steps=200 --config.data.dir=/data/lra_release --workdir runs/text_nys
    spectral-jax eval --workdir runs/listops_quick [--checkpoint best|latest|STEP] [--split test]
    spectral-jax table runs/*
    spectral-jax config lra/listops:quick --config.train.steps=10

``--config FILE.py[:ARG]`` calls ``get_config(ARG)`` of the file; every ``--config.a.b=VALUE``
then overrides one field (VALUE parsed by the field's type), as with
``ml_collections.config_flags`` but without absl; ``--config.model.attention=X`` re-runs
``get_config`` with ``attention=X`` (:mod:`spectral_jax.lra.train.overrides`). Errors in the
config, the data directory or the workdir print one message and exit with status 2; a diverged
run exits with status 1 (both reported by :func:`spectral_jax.lra.cli.main`). SIGINT (Ctrl-C)
or SIGTERM stops ``train`` after the current step, checkpointed, with the line ``interrupted at
step N; checkpoint saved; rerun the same command to resume`` and exit status 130 or 143
(:mod:`spectral_jax.lra.train.interrupt`).
"""

from __future__ import annotations

import argparse
import json
import sys

from spectral_jax.lra.train.overrides import load_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``train``, ``config``, ``eval`` and ``table`` on the ``spectral-jax`` command."""
    train = subparsers.add_parser(
        "train", help="train and evaluate an LRA config",
        description="Train, evaluate on validation, checkpoint, and report test accuracy. "
        "Re-running the same command resumes from the last checkpoint; Ctrl-C or SIGTERM "
        "stops after the current step with a checkpoint (exit status 130 or 143). Extra "
        "--config.FIELD=VALUE arguments override config fields.",
    )
    train.add_argument("--config", required=True, metavar="NAME|FILE.py[:ARG]",
                       help="a shipped config's name (lra/<task>, lm/<name>) or a config "
                       "file, then its argument, e.g. lra/listops:quick or "
                       "lra/text:attention=nystrom,protocol=small")
    train.add_argument("--workdir", required=True, help="run directory (checkpoints, logs)")
    train.add_argument("--overwrite", action="store_true",
                       help="delete a previous run with another config in --workdir")
    train.add_argument("--extend", action="store_true",
                       help="continue the (finished) run in --workdir to a larger "
                       "--config.train.steps, nothing else changed; the learning-rate schedule "
                       "is re-evaluated for the new total, so rsqrt and constant continue "
                       "unchanged and cosine and linear decay stretch to end at the new total "
                       "(recorded in results.json, extensions.json and metrics.jsonl)")
    train.add_argument("--distributed", action="store_true",
                       help="call jax.distributed.initialize() (multi-host; also "
                       "SPECTRAL_JAX_DISTRIBUTED=1)")
    train.set_defaults(func=_train, config_overrides=[])
    _accept_config_overrides(train)

    show = subparsers.add_parser(
        "config", help="print a config as a run would record it",
        description="Loads NAME|FILE.py[:ARG], applies --config.FIELD=VALUE overrides, checks it, "
        "and prints the JSON that `train` would write to WORKDIR/config.json.",
    )
    show.add_argument("config", metavar="NAME|FILE.py[:ARG]",
                      help="a shipped config's name or a config file, e.g. lra/listops:quick")
    show.set_defaults(func=_show_config, config_overrides=[])
    _accept_config_overrides(show)

    evaluate = subparsers.add_parser("eval", help="evaluate a run's checkpoint")
    evaluate.add_argument("--workdir", required=True)
    evaluate.add_argument("--checkpoint", default="best", help="best, latest or a step")
    evaluate.add_argument("--split", default="test", choices=("train", "validation", "test"))
    evaluate.add_argument("--distributed", action="store_true")
    evaluate.set_defaults(func=_eval)

    table = subparsers.add_parser("table", help="Markdown table of finished runs")
    table.add_argument("runs", nargs="+", metavar="RUN_DIR",
                       help="run folders, or sweep folders (the runs they hold)")
    table.add_argument("--json", default=None, help="also write the figures to this JSON file")
    table.add_argument("--plot", default=None,
                       help="also write test accuracy vs training examples/s to this PNG "
                       "(needs matplotlib: pip install 'spectral_jax[bench]')")
    table.add_argument("--format", choices=("full", "readme"), default="full",
                       help="full: accuracy per method x task, cost, every run, failures; "
                       "readme: the README's table per task, each method against softmax")
    table.set_defaults(func=_table)


def _accept_config_overrides(parser: argparse.ArgumentParser) -> None:
    """Lets ``parser`` take any ``--config.a.b=V`` / ``--config.a.b V`` into ``config_overrides``.

    argparse has no wildcard options, and the dispatcher calls ``parse_args`` (which rejects
    unknown arguments), so the subparser's ``parse_known_args`` collects them first.
    """
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        namespace, extras = original(args, namespace)
        rest, overrides, i = [], list(getattr(namespace, "config_overrides", [])), 0
        while i < len(extras):
            item = extras[i]
            if item.startswith("--config."):
                body = item[len("--config."):]
                if "=" not in body and i + 1 < len(extras):
                    body, i = f"{body}={extras[i + 1]}", i + 1
                overrides.append(body)
            else:
                rest.append(item)
            i += 1
        namespace.config_overrides = overrides
        return namespace, rest

    parser.parse_known_args = parse_known_args


def _train(args: argparse.Namespace) -> int:
    from spectral_jax.lra.train.distributed import maybe_initialize

    maybe_initialize(args.distributed or None)
    from spectral_jax.lra.train.interrupt import TrainingInterrupted
    from spectral_jax.lra.train.loop import train_and_evaluate

    config = load_config(args.config, args.config_overrides)
    try:
        train_and_evaluate(config, args.workdir, overwrite=args.overwrite,
                           extend=args.extend)
    except TrainingInterrupted as e:
        print(e, file=sys.stderr, flush=True)
        return e.exit_status
    return 0


def _show_config(args: argparse.Namespace) -> int:
    from spectral_jax.lra.train.run import recorded_config

    config = recorded_config(load_config(args.config, args.config_overrides))
    print(config.to_json(sort_keys=True, indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from spectral_jax.lra.train.distributed import maybe_initialize

    maybe_initialize(args.distributed or None)
    from spectral_jax.lra.train.loop import evaluate_checkpoint

    result = evaluate_checkpoint(args.workdir, checkpoint=args.checkpoint, split=args.split)
    print(f"{args.split} accuracy {result['accuracy']:.4f} (checkpoint step {result['step']}, "
          f"{result['count']} examples); majority-class baseline {result['majority_baseline']:.4f}")
    print(json.dumps(result))
    return 0


def _table(args: argparse.Namespace) -> int:
    from spectral_jax.lra.train.table import (
        load_results,
        markdown_table,
        summary_json,
        write_outputs,
    )
    from spectral_jax.lra.train.table_readme import readme_tables

    results = load_results(args.runs)
    text = (readme_tables if args.format == "readme" else markdown_table)(results)
    print(text, end="")
    write_outputs(text, summary_json(results), None, args.json, args.plot)
    return 0
