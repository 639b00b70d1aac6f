"""``spectral-jax bench speed | error | compile | dump-qkv | decode | parallel``.

    spectral-jax bench speed --lengths 1024 2048 4096 8192 16384 --out benchmarks/speed_cpu
    spectral-jax bench error --lengths 1024 --budgets 16 32 64 128 256 --out benchmarks/error
    spectral-jax bench dump-qkv --workdir runs/listops_quick --out runs/listops_quick/qkv.npz
    spectral-jax bench error --qkv runs/listops_quick/qkv.npz --out benchmarks/error_listops
    spectral-jax bench compile --out benchmarks/compile_time_cpu
    spectral-jax bench decode --lengths 1024 4096 16384 65536 --out benchmarks/decode_cpu
    spectral-jax bench parallel --devices 8 --out benchmarks/parallel_cpu

Each writes ``<out>.json`` and ``<out>.png`` (and prints a rich table and where the files
went); without ``--out``, into ``bench_out/`` (git-ignored), not the current folder. Bad
arguments print one message and exit with status 2 (:func:`spectral_jax.lra.cli.main`).
Building the parser imports no JAX: method names are checked against the registry only when
``--methods`` is given.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import platform
from typing import Any

from spectral_jax import UsageError

# Where results go without --out: one folder the repository's .gitignore lists.
DEFAULT_OUT = {command: os.path.join("bench_out", command)
               for command in ("speed", "error", "compile", "decode", "parallel")}


def _console() -> Any:
    from rich.console import Console

    return Console(width=120)


def _environment() -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    # CPU timings at long n depend on the allocator (see benchmarks/README.md), so a run says
    # which one it had.
    allocator = {name: value for name, value in sorted(os.environ.items())
                 if value and (name.startswith("MALLOC_")
                               or name in ("LD_PRELOAD", "GLIBC_TUNABLES", "XLA_FLAGS"))}
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "device": getattr(device, "device_kind", str(device)),
            "device_count": jax.device_count(), "host": platform.node(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "allocator_env": allocator}


def _all_methods() -> list[str]:
    from spectral_jax.attention import available_attentions

    return list(available_attentions())


def _method(name: str) -> str:
    """An argparse ``type``: a registered attention name (the registry loads on first use)."""
    names = _all_methods()
    if name not in names:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r} (choose from {', '.join(names)})")
    return name


def _budget(text: str) -> tuple[str, int]:
    """An argparse ``type``: ``PARAM=N`` (checked against the registry when the command runs)."""
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().removeprefix("-").isdigit():
        raise argparse.ArgumentTypeError(f"expected PARAM=N such as num_landmarks=64; got {text!r}")
    return name.strip().replace("-", "_"), int(value)


def _wrote(json_path: Any, png_path: Any) -> str:
    """Where the results went; the plot is None when matplotlib is missing."""
    return f"wrote {json_path}" + ("" if png_path is None else f" and {png_path}")


def _speed(args: argparse.Namespace) -> int:
    from spectral_jax.lra.bench import memory, report, roofline, speed

    if args.methods is None:
        args.methods = _all_methods()
    console = _console()
    if args.memory_budget_gb is not None and not 0 < args.memory_budget_gb < math.inf:
        raise UsageError(f"`memory_budget_gb` must be a positive, finite number of GiB; got "
                         f"{args.memory_budget_gb!r}.")
    budget = None if args.memory_budget_gb is None else int(args.memory_budget_gb * 2**30)
    if budget is None:
        budget = memory.default_memory_budget_bytes()
    console.print(f"memory budget {budget / 2**30:.2f} GiB; compiling every configuration "
                  "first to read its peak memory")
    budgets = dict(args.budget)
    unknown = sorted(set(budgets) - set(speed.budget_parameters()))
    if unknown:
        raise UsageError(f"`budget`: {unknown[0]!r} is not a budget parameter of a registered "
                         f"method; known: {', '.join(speed.budget_parameters())}")
    records = speed.run_speed(
        methods=args.methods, lengths=args.lengths, batch=args.batch, heads=args.heads,
        head_dim=args.head_dim, dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
        memory_budget_bytes=budget, modes=args.modes, head_chunk_size=args.head_chunk_size,
        exact_implementations=args.exact_impls, run=not args.compile_only,
        cost_analysis=args.cost_analysis or args.roofline, progress=console.print,
        **budgets,
    )
    records = speed.add_ratios(records)
    rates = None if not args.roofline or args.compile_only else roofline.calibrate(
        head_dim=args.head_dim, thin_rows=max(args.lengths) * args.heads * args.batch)
    records = records if rates is None else roofline.add_roofline(records, rates)
    config = {k: v for k, v in vars(args).items() if k not in ("func", "budget")}
    config.update(budgets)  # e.g. "num_landmarks": 64, as the flags gave them
    config["memory_budget_bytes"] = budget
    title = (f"bench speed: batch {args.batch}, {args.heads} heads, head_dim {args.head_dim}, "
             f"{args.dtype}"
             + "".join(f", {p} {v}" for p, v in budgets.items())
             + ("" if args.head_chunk_size is None else
                f", head_chunk_size {args.head_chunk_size}"))
    console.print(report.speed_table(records, title=title))
    for note in report.speed_notes(records):
        console.print(f"[yellow]{note}[/yellow]")
    payload = {"kind": "speed", "config": config, "environment": _environment(),
               "records": records}
    if rates is not None:
        payload["machine_rates"] = rates._asdict()
        console.print(roofline.write_markdown(f"{args.out}.md", records, rates, title),
                      soft_wrap=True, highlight=False, markup=False)
    json_path = report.write_json(f"{args.out}.json", payload)
    png_path = report.plot_speed(records, f"{args.out}.png", title=title)
    console.print(_wrote(json_path, png_path), soft_wrap=True, highlight=False)
    return 0


def _error(args: argparse.Namespace) -> int:
    import numpy as np

    from spectral_jax.attention import get_attention_spec
    from spectral_jax.lra.bench import error, report

    if args.methods is None:
        args.methods = [n for n in _all_methods() if not get_attention_spec(n).exact]
    console = _console()
    qkv = None
    if args.qkv is not None:
        with np.load(args.qkv) as data:
            missing = {"query", "key", "value"} - set(data.files)
            if missing:
                raise UsageError(f"--qkv {args.qkv}: missing arrays {sorted(missing)}; "
                                 "write the file with `spectral-jax bench dump-qkv`.")
            qkv = error.QKV(data["query"], data["key"], data["value"],
                            data["mask"] if "mask" in data.files else None, name="checkpoint")
    records = []
    for length in args.lengths if qkv is None else [None]:
        sizes = {} if length is None else {"length": length}  # qkv fixes its own length
        records += error.run_error(
            methods=args.methods, budgets=args.budgets, regimes=args.regimes, seeds=args.seeds,
            **sizes, heads=args.heads, head_dim=args.head_dim, batch=args.batch,
            matrix_max_length=args.matrix_max_length, sharpness=args.sharpness,
            linformer_init=args.linformer_init, qkv=qkv, progress=console.print,
        )
    rows = []
    for length in dict.fromkeys(r["length"] for r in records):
        sub = error.summarize([r for r in records if r["length"] == length])
        rows += [{**row, "length": length} for row in sub]
        console.print(report.error_table(sub, title=f"bench error, n = {length}"))
    config = {k: v for k, v in vars(args).items() if k != "func"}
    payload = {"kind": "error", "config": config, "environment": _environment(),
               "summary": rows, "records": records}
    json_path = report.write_json(f"{args.out}.json", payload)
    last = max(r["length"] for r in rows)
    png_path = report.plot_error([r for r in rows if r["length"] == last], f"{args.out}.png",
                                 metric=args.plot_metric,
                                 title=f"relative {args.plot_metric} error, n = {last}")
    console.print(_wrote(json_path, png_path), soft_wrap=True, highlight=False)
    return 0


def _dump_qkv(args: argparse.Namespace) -> int:
    from spectral_jax.lra.bench import dump

    path = dump.dump_qkv(args.workdir, args.out, layer=args.layer, num_examples=args.examples,
                         split=args.split, checkpoint=args.checkpoint)
    print(f"wrote {path}")
    return 0


def _compile(args: argparse.Namespace) -> int:
    from spectral_jax.lra.bench import compile as compile_lib
    from spectral_jax.lra.bench import report

    console = _console()
    records = compile_lib.run_compile(args.config, args.methods, args.repeats,
                                      progress=console.print)
    console.print(compile_lib.markdown_table(records), highlight=False)
    payload = {"kind": "compile", "config": {k: v for k, v in vars(args).items()
                                             if k != "func"},
               "environment": {**_environment(), "load_average": os.getloadavg()},
               "records": records}
    json_path = report.write_json(f"{args.out}.json", payload)
    md_path = compile_lib.write_markdown(f"{args.out}.md", records, payload)
    console.print(f"wrote {json_path} and {md_path}", soft_wrap=True, highlight=False)
    return 0


def _decode(args: argparse.Namespace) -> int:
    from spectral_jax.lra.bench import decode, report

    console = _console()
    records = decode.run_decode(args.methods, lengths=args.lengths, steps=args.steps,
                                batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                                repeats=args.repeats, progress=console.print)
    title = (f"bench decode: batch {args.batch}, {args.heads} head(s), head_dim "
             f"{args.head_dim}, float32, {args.steps} tokens per timed scan")
    console.print(decode.decode_table(records, title=title))
    payload = {"kind": "decode", "config": {k: v for k, v in vars(args).items()
                                            if k != "func"},
               "environment": {**_environment(), "load_average": os.getloadavg()},
               "records": records}
    json_path = report.write_json(f"{args.out}.json", payload)
    png_path = decode.plot_decode(records, f"{args.out}.png", title=title)
    console.print(_wrote(json_path, png_path), soft_wrap=True, highlight=False)
    return 0


def _parallel(args: argparse.Namespace) -> int:
    import jax

    if args.devices < 2 or not 0 < args.memory_budget_gb < math.inf:
        raise UsageError(f"bench parallel: `--devices` must be >= 2 and `--memory-budget-gb` "
                         f"positive; got {args.devices} and {args.memory_budget_gb}.")
    # Simulated CPU devices must be asked for before JAX starts its backend; a process whose
    # backend already runs (a notebook, the tests) keeps the devices it has, and one that
    # asked for more than enough keeps its number.
    try:
        if jax.config.jax_num_cpu_devices < args.devices:
            jax.config.update("jax_num_cpu_devices", args.devices)
    except RuntimeError:
        pass
    from spectral_jax.lra.bench import parallel, report

    console = _console()
    result = parallel.run_parallel(
        args.methods, lengths=args.lengths, devices=args.devices, head_dim=args.head_dim,
        memory_budget_bytes=int(args.memory_budget_gb * 2**30), progress=console.print)
    title = (f"bench parallel: 1 vs {args.devices} {jax.default_backend()} devices, head_dim "
             f"{args.head_dim}, float32, forward + input gradients, compiled (nothing runs)")
    console.print(parallel.parallel_table(result, title=title))
    payload = {"kind": "parallel", "config": {k: v for k, v in vars(args).items()
                                              if k != "func"},
               "environment": _environment(), **result}
    json_path = report.write_json(f"{args.out}.json", payload)
    command = ("spectral-jax bench parallel"
               + ("" if args.methods is None else " --methods " + " ".join(args.methods))
               + f" --lengths {' '.join(map(str, args.lengths))} --devices {args.devices} "
               f"--head-dim {args.head_dim} --memory-budget-gb {args.memory_budget_gb:g} "
               f"--out {args.out}")
    md = pathlib.Path(f"{args.out}.md")
    md.write_text(parallel.markdown(result, title=title, command=command))
    png_path = parallel.plot_parallel(result, f"{args.out}.png", title=title)
    console.print(_wrote(json_path, png_path) + f" and {md}", soft_wrap=True, highlight=False)
    return 0


def add_parser(subparsers: Any) -> None:
    """Registers ``bench`` with the ``speed``, ``error`` and ``dump-qkv`` subcommands.

    Args:
      subparsers: the object returned by ``ArgumentParser.add_subparsers``.

    Example:
      >>> import argparse
      >>> from spectral_jax.lra.cli.bench import add_parser
      >>> parser = argparse.ArgumentParser(); add_parser(parser.add_subparsers(dest="command"))
      >>> parser.parse_args(["bench", "speed", "--lengths", "64"]).lengths
      [64]
    """
    bench = subparsers.add_parser("bench", help="speed, memory and approximation-error benchmarks")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    sp = sub.add_parser("speed", help="time and peak memory of every method vs exact attention")
    sp.add_argument("--methods", nargs="+", type=_method, default=None, metavar="METHOD",
                    help="registry names (default: every registered method)")
    sp.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384])
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--heads", type=int, default=4)
    sp.add_argument("--head-dim", type=int, default=64)
    sp.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    sp.add_argument("--budget", action="append", type=_budget, default=[], metavar="PARAM=N",
                    help="a budget parameter and its value, e.g. num_landmarks=64 (repeatable; "
                    "default: each method's own from the registry)")
    sp.add_argument("--repeats", type=int, default=5, help="timed calls; the median is reported")
    sp.add_argument("--warmup", type=int, default=1, help="untimed calls before timing")
    sp.add_argument("--modes", nargs="+", choices=("fwd", "fwd_bwd"), default=["fwd", "fwd_bwd"])
    sp.add_argument("--memory-budget-gb", type=float, default=None,
                    help="skip configurations whose compiled peak exceeds this many GiB "
                         "(default: 0.9 x the accelerator memory limit, else 0.5 x the "
                         "host's available RAM, since XLA's CPU estimate undercounts)")
    sp.add_argument("--head-chunk-size", type=int, default=None,
                    help="(example, head) slices per step for the approximate methods; "
                         "default: about 4096 tokens' worth on CPU for long inputs, else all")
    sp.add_argument("--exact-impls", nargs="+", choices=("xla", "cudnn"), default=[],
                    help="also time exact attention with these jax.nn.dot_product_attention "
                         "implementations, as softmax[xla] / softmax[cudnn] (cuDNN: GPU, "
                         "16-bit inputs; skipped with the reason where unavailable)")
    sp.add_argument("--compile-only", action="store_true",
                    help="compile and report memory without timing anything")
    sp.add_argument("--cost-analysis", action="store_true",
                    help="also report XLA's operation count per configuration (GFLOP, all "
                         "heads at once, nothing rematerialised): unchanged by machine load")
    sp.add_argument("--roofline", action="store_true",
                    help="each rate as a fraction of its roof (a matmul and a copy timed in "
                         "the same run), in OUT.md; implies --cost-analysis")
    sp.add_argument("--out", default=DEFAULT_OUT["speed"],
                    help="writes OUT.json and OUT.png (the default folder is git-ignored)")
    sp.set_defaults(func=_speed)

    er = sub.add_parser("error", help="approximation error vs exact attention, per budget")
    er.add_argument("--methods", nargs="+", type=_method, metavar="METHOD", default=None,
                    help="registered methods (default: every approximate one)")
    er.add_argument("--budgets", nargs="+", type=int, default=[16, 32, 64, 128, 256],
                    help="values of each method's budget parameter (num_landmarks, "
                    "num_features, proj_len, ...: see the registry)")
    er.add_argument("--regimes", nargs="+",
                    choices=("diffuse", "sharp", "random_walk", "varying_norm"),
                    default=["diffuse", "sharp", "random_walk", "varying_norm"])
    er.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    er.add_argument("--lengths", nargs="+", type=int, default=[1024])
    er.add_argument("--batch", type=int, default=1)
    er.add_argument("--heads", type=int, default=2)
    er.add_argument("--head-dim", type=int, default=64)
    er.add_argument("--sharpness", type=float, default=2.0, help="norm scale of q = k ('sharp')")
    er.add_argument("--matrix-max-length", type=int, default=2048,
                    help="implicit-matrix (Frobenius, spectral) errors only up to this n")
    er.add_argument("--linformer-init", choices=("pool", "random"), default="pool")
    er.add_argument("--qkv", default=None,
                    help="an .npz from `bench dump-qkv`: use these inputs instead of regimes")
    er.add_argument("--plot-metric", choices=("output", "frobenius", "spectral"),
                    default="output")
    er.add_argument("--out", default=DEFAULT_OUT["error"],
                    help="writes OUT.json and OUT.png (the default folder is git-ignored)")
    er.set_defaults(func=_error)

    cp = sub.add_parser("compile", help="lower + compile time of one training step per "
                        "method, as a ratio to softmax's")
    cp.add_argument("--config", default="lra/listops:quick",
                    help="NAME|FILE.py[:ARG] of the training config (attention= set per method)")
    cp.add_argument("--methods", nargs="+", type=_method, default=None, metavar="METHOD",
                    help="registry names (default: every registered method)")
    cp.add_argument("--repeats", type=int, default=1,
                    help="compiles per method; the minimum is reported")
    cp.add_argument("--out", default=DEFAULT_OUT["compile"],
                    help="writes OUT.json and OUT.md (the default folder is git-ignored)")
    cp.set_defaults(func=_compile)

    de = sub.add_parser("decode", help="per-token decoding time and state size vs context "
                        "length, as ratios to softmax with a KV cache")
    de.add_argument("--methods", nargs="+", type=_method, default=None, metavar="METHOD",
                    help="methods with a decode form (default: all; softmax always runs)")
    de.add_argument("--lengths", nargs="+", type=int,
                    default=[1024, 2048, 4096, 8192, 16384, 32768, 65536],
                    help="context lengths: tokens already in the state")
    de.add_argument("--steps", type=int, default=64, help="tokens decoded per timed scan")
    de.add_argument("--batch", type=int, default=1)
    de.add_argument("--heads", type=int, default=1)
    de.add_argument("--head-dim", type=int, default=16)
    de.add_argument("--repeats", type=int, default=7,
                    help="timed scans; the fastest is reported (and the median recorded)")
    de.add_argument("--out", default=DEFAULT_OUT["decode"],
                    help="writes OUT.json and OUT.png (the default folder is git-ignored)")
    de.set_defaults(func=_decode)

    pa = sub.add_parser("parallel", help="per-device memory and collective bytes of a sequence "
                        "split over devices, and the longest sequence that fits")
    pa.add_argument("--methods", nargs="+", type=_method, default=None, metavar="METHOD",
                    help="methods with a sequence-sharded form (default: all of them)")
    pa.add_argument("--lengths", nargs="+", type=int,
                    default=[2**12, 2**14, 2**16, 2**18, 2**20])
    pa.add_argument("--devices", type=int, default=8,
                    help="mesh size (CPU: simulated devices, which measure memory and "
                         "traffic, not speed)")
    pa.add_argument("--head-dim", type=int, default=64)
    pa.add_argument("--memory-budget-gb", type=float, default=1.0,
                    help="per-device memory for the longest-sequence search")
    pa.add_argument("--out", default=DEFAULT_OUT["parallel"],
                    help="writes OUT.json, OUT.md and OUT.png (the default folder is "
                         "git-ignored)")
    pa.set_defaults(func=_parallel)

    dq = sub.add_parser("dump-qkv", help="capture q/k/v of one attention layer of a trained run")
    dq.add_argument("--workdir", required=True, help="a `spectral-jax train` run directory")
    dq.add_argument("--out", required=True, help="destination .npz")
    dq.add_argument("--layer", type=int, default=0, help="encoder layer index")
    dq.add_argument("--examples", type=int, default=4, help="evaluation examples to run")
    dq.add_argument("--split", default="test", help="data split the examples come from")
    dq.add_argument("--checkpoint", default="best", help="best, latest or a step number")
    dq.set_defaults(func=_dump_qkv)
