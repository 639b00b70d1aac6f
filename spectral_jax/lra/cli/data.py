"""`spectral-jax data ...`: generate ListOps / Pathfinder, inspect a task's data."""

from __future__ import annotations

import argparse
import json

from spectral_jax import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Registers `data` with sub-commands `listops`, `pathfinder` and `info`.

    Args:
        subparsers: the top-level `spectral-jax` sub-parser collection.

    Example:
        >>> p = argparse.ArgumentParser(); add_parser(p.add_subparsers())
        >>> p.parse_args(["data", "listops", "--out", "d"]).train
        96000
    """
    data = subparsers.add_parser("data", help="generate or inspect LRA task data")
    sub = data.add_subparsers(dest="data_command", required=True)

    lo = sub.add_parser("listops", help="generate ListOps TSVs (LRA algorithm)")
    lo.add_argument("--out", required=True, help="output folder for basic_{train,val,test}.tsv")
    lo.add_argument("--train", type=int, default=96000)
    lo.add_argument("--val", type=int, default=2000)
    lo.add_argument("--test", type=int, default=2000)
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--min-length", type=int, default=500, help="exclusive lower token bound")
    lo.add_argument("--max-length", type=int, default=2000, help="exclusive upper token bound")
    lo.add_argument("--max-depth", type=int, default=10)
    lo.add_argument("--max-args", type=int, default=10)
    lo.set_defaults(func=_listops)

    pf = sub.add_parser("pathfinder", help="generate Pathfinder PNGs + metadata")
    pf.add_argument("--out", required=True, help="root folder; writes pathfinder<R>/<difficulty>/")
    pf.add_argument("--resolution", type=int, default=32)
    pf.add_argument("--difficulty", default="curv_contour_length_14")
    pf.add_argument("--num-images", type=int, default=20000)
    pf.add_argument("--seed", type=int, default=0)
    pf.set_defaults(func=_pathfinder)

    info = sub.add_parser(
        "info", help="print a task's sizes, vocab and label balance",
        description="Reads a task's data as a config reads it (--config NAME|FILE.py[:ARG] and "
        "--config.FIELD=VALUE overrides: its task, data.dir and data.options) or with the "
        "reader's own defaults (TASK --data-dir DIR); the lengths shown are those it reads at.",
    )
    info.add_argument("task", nargs="?", default=None,
                      help="listops, text, retrieval, image, pathfinder or pathx "
                      "(default: the config's task)")
    info.add_argument("--data-dir", default=None, help="default: the config's data.dir")
    info.add_argument("--config", default=None, metavar="NAME|FILE.py[:ARG]",
                      help="read the data as this training config does, e.g. "
                      "lra/listops:quick")
    info.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="task option, e.g. max_length=1000 (value parsed as JSON if it can "
                      "be); overrides the config's data.options")
    info.set_defaults(func=_info, config_overrides=[])
    from spectral_jax.lra.cli.train import _accept_config_overrides

    _accept_config_overrides(info)


def _listops(args: argparse.Namespace) -> int:
    from spectral_jax.lra.data import listops_generator

    stats = listops_generator.generate(
        args.out, num_train=args.train, num_val=args.val, num_test=args.test, seed=args.seed,
        min_length=args.min_length, max_length=args.max_length, max_depth=args.max_depth,
        max_args=args.max_args,
    )
    print(json.dumps(stats, indent=1))
    return 0


def _pathfinder(args: argparse.Namespace) -> int:
    from spectral_jax.lra.data import pathfinder

    stats = pathfinder.generate(args.out, resolution=args.resolution, difficulty=args.difficulty,
                                num_images=args.num_images, seed=args.seed)
    print(json.dumps(stats, indent=1))
    return 0


def _parse_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--option must look like KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _info_source(args: argparse.Namespace) -> tuple[str, str, dict, str]:
    """The task, data folder and reader options to show, and where the length comes from."""
    options = dict(map(_parse_option, args.option))
    if args.config is None:
        if args.config_overrides:
            raise UsageError("--config.FIELD=VALUE overrides need --config FILE.py[:ARG]")
        if args.task is None or args.data_dir is None:
            raise UsageError("give TASK and --data-dir, or --config FILE.py[:ARG]")
        origin = ("--option max_length" if "max_length" in options else
                  "the reader's default; a config may read at another length: pass "
                  "--config FILE.py[:ARG]")
        return args.task, args.data_dir, options, origin
    from spectral_jax.lra.train.overrides import load_config

    config = load_config(args.config, args.config_overrides)
    if args.task is not None and args.task != config.task:
        raise UsageError(f"task {args.task!r} differs from the config's task {config.task!r}")
    where = "--option max_length" if "max_length" in options else f"the config {args.config}"
    return (config.task, args.data_dir or config.data.dir,
            {**config.data.options.to_dict(), **options}, where)


# `data info` lists the share of every class up to this many classes.
_LISTED_CLASSES = 64


def _info(args: argparse.Namespace) -> int:
    import numpy as np

    from spectral_jax.lra.data import IGNORE_INDEX, load_task, majority_baseline

    name, data_dir, options, origin = _info_source(args)
    task = load_task(name, data_dir, **options)
    print(f"task {task.name}: vocab {task.vocab_size}, classes {task.num_classes}, "
          f"max_length {task.max_length} ({origin}), dual {task.dual}")
    print(f"source: {task.source}")
    for name, split in task.splits.items():
        counts = np.bincount(split.labels, minlength=task.num_classes)
        if task.num_classes <= _LISTED_CLASSES:
            share = " ".join(f"{c / max(len(split), 1):.3f}" for c in counts)
        else:  # a language model's labels are token ids: one share each would be unreadable
            share = (f"{int((counts > 0).sum())} of {task.num_classes} ids occur, the most "
                     f"frequent in {counts.max() / max(len(split), 1):.3f}")
        base = f"{majority_baseline(split):.3f}" if len(split) else "n/a"
        print(f"  {name:<10} n={len(split):<7} inputs {split.inputs.shape} "
              f"valid tokens {split.mask.mean() if split.mask.size else 0:.3f} "
              f"truncated {task.truncated.get(name, 0)} majority {base}")
        print(f"  {'':<10} label shares: {share}")
        if split.targets is not None and len(split):
            scored = (split.targets != IGNORE_INDEX).sum(axis=1)
            print(f"  {'':<10} scored positions (targets) per sequence: {scored.min()} to "
                  f"{scored.max()}, mean {scored.mean():.2f}")
    return 0
