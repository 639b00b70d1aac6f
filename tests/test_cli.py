"""The `spectral-jax` entry point: `--help` stays light, and user errors are one line, status 2."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

import pytest

from spectral_jax import UnknownNameError, UsageError, UsageTypeError
from spectral_jax.lra import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
HELP_COMMANDS = ["", "train", "config", "eval", "table", "sweep", "data", "data listops",
                 "data pathfinder", "data info", "bench", "bench speed", "bench error",
                 "bench dump-qkv"]


def test_help_of_every_command_imports_no_jax():
    # One interpreter for all commands: a fresh process per command would cost seconds each.
    script = f"""
import contextlib, io, sys
from spectral_jax.lra import cli
cli.build_parser()
texts = {{}}
for command in {HELP_COMMANDS!r}:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            cli.main([*command.split(), "--help"])
        except SystemExit as e:
            assert e.code == 0, (command, e.code)
    assert "usage: spectral-jax" in out.getvalue(), command
    texts[command] = " ".join(out.getvalue().split())
# Defaults are shown: a value, and one named in the help's own words.
assert "(default: bench_out/speed)" in texts["bench speed"], texts["bench speed"]
assert "--repeats REPEATS timed calls; the median is reported (default: 5)" in texts["bench speed"]
assert "--heads HEADS default: 4" in texts["bench speed"]
assert "best, latest or a step (default: best)" in texts["eval"]
# --config takes a shipped config's name as well as a file.
assert "--config NAME|FILE.py[:ARG] a shipped config's name (lra/<task>" in texts["train"]
assert "(default: None)" not in " ".join(texts.values())
heavy = sorted(m for m in ("jax", "jaxlib", "flax", "optax", "orbax") if m in sys.modules)
print(heavy)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"--help imported {done.stdout.strip()}"


class _Diverged(RuntimeError):
    exit_status = 1


@pytest.mark.parametrize("error, status, line", [
    (UsageError("`head_chunk_size` must be a positive int; got 0."), 2,
     "spectral-jax bench speed: error: `--head-chunk-size` must be a positive int; got 0."),
    (FileNotFoundError("no data in 'd'\n(set --config.data.dir)"), 2,
     "spectral-jax bench speed: error: no data in 'd' (set --config.data.dir)"),
    (UnknownNameError("no such split"), 2, "spectral-jax bench speed: error: no such split"),
    (UsageTypeError("`head_chunk_size` must be an int"), 2,
     "spectral-jax bench speed: error: `--head-chunk-size` must be an int"),
    (NotADirectoryError("runs/a is a file"), 2,
     "spectral-jax bench speed: error: runs/a is a file"),
    (_Diverged("loss is NaN at step 3"), 1,
     "spectral-jax bench speed: error: loss is NaN at step 3"),
])
def test_user_errors_are_one_line_with_an_exit_status(error, status, line, capsys):
    args = argparse.Namespace(command_prog="spectral-jax bench speed", head_chunk_size=0)
    assert cli.report_error(error, args) == status
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("error", [ZeroDivisionError("x"), ValueError("x"), TypeError("x"),
                                   KeyError("x"), NotImplementedError("x")])
def test_bugs_keep_their_traceback(error):
    # Only UsageError (and missing files) are the user's; a plain ValueError or KeyError is a bug.
    args = argparse.Namespace(command_prog="spectral-jax table", func=lambda a: 1 / 0)
    assert cli.report_error(error, args) is None
    parser = cli.build_parser()
    parsed = parser.parse_args(["table", "nowhere"])
    assert parsed.command_prog == "spectral-jax table"


def test_a_command_line_registers_its_subcommand_alone():
    script = """
import sys
from spectral_jax.lra import cli
parser = cli.build_parser("train")
choices = sorted(parser._subparsers._group_actions[0].choices)
print(choices, sorted(m for m in sys.modules if m.startswith("spectral_jax.lra.cli.")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("['config', 'eval', 'table', 'train'] "
                                   "['spectral_jax.lra.cli.train']")


def test_bench_without_out_writes_into_the_ignored_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["bench", "speed", "--methods", "nystrom", "--lengths", "32", "--heads", "1",
                   "--head-dim", "4", "--budget", "num_landmarks=4", "--repeats", "1",
                   "--modes", "fwd"])
    assert rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_out"]
    assert sorted(p.name for p in (tmp_path / "bench_out").iterdir()) == ["speed.json",
                                                                          "speed.png"]
    assert "wrote bench_out/speed.json and bench_out/speed.png" in capsys.readouterr().out
    assert cli.build_parser().parse_args(["bench", "error"]).out == "bench_out/error"
    assert "/bench_out/" in (ROOT / ".gitignore").read_text().split()
