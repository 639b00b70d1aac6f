"""The `spectral-jax` command: one entry point, one subcommand per concern.

Each subcommand's module in this package registers it through an
``add_parser(subparsers)`` function that sets ``func`` on its parser; this file only
dispatches. A command line naming a subcommand imports that subcommand's module alone;
``--help`` and a bare ``spectral-jax`` register them all. Neither imports JAX (tested).

Errors are reported here, once for every subcommand: an error the user can fix (a
:class:`spectral_jax.UsageError`, raised for every bad value, or a missing file or folder)
prints one line, ``spectral-jax <command>: error: <message>``, and exits with status 2, as
argparse does for a bad flag. An exception with an ``exit_status`` attribute (a diverged
training run: 1) prints the same line and exits with that status. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from spectral_jax import UsageError
from spectral_jax.lra import INSTALL_HINT, missing_dependencies

# subcommand -> module that defines `add_parser(subparsers)`.
_SUBCOMMANDS = {
    "train": "spectral_jax.lra.cli.train",
    "config": "spectral_jax.lra.cli.train",
    "eval": "spectral_jax.lra.cli.train",
    "table": "spectral_jax.lra.cli.train",
    "sweep": "spectral_jax.lra.cli.sweep",
    "data": "spectral_jax.lra.cli.data",
    "bench": "spectral_jax.lra.cli.bench",
    "generate": "spectral_jax.lra.cli.generate",
}
# What the user gets wrong, as opposed to what the program gets wrong.
_USAGE_ERRORS = (UsageError, FileNotFoundError, NotADirectoryError)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `spectral-jax` parser (imports no JAX).

    Args:
        command: a subcommand name: only its module registers its parsers (what running it
          needs). None or an unknown name registers every subcommand (``--help``, errors).

    Example:
        >>> build_parser().parse_args(["table", "runs/a"]).runs
        ['runs/a']
    """
    parser = argparse.ArgumentParser(
        prog="spectral-jax",
        description="Efficient attention in JAX: LRA training, data and benchmarks.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = [_SUBCOMMANDS[command]] if command in _SUBCOMMANDS else _SUBCOMMANDS.values()
    for module_name in dict.fromkeys(modules):
        importlib.import_module(module_name).add_parser(subparsers)
    _record_prog(parser)
    return parser


class _DefaultsFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to an option's help, except where it says nothing (None, a flag
    that is off, a required option) or the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default:" in text.lower() or action.required
                or default in (None, False, argparse.SUPPRESS) or default == []
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)".strip()


def _record_prog(parser: argparse.ArgumentParser) -> None:
    """Stores each subcommand's full name (``spectral-jax data listops``) as ``args.command_prog``
    and gives every parser the help formatter that shows defaults.

    A subparser's defaults override its parent's, so the deepest command chosen wins.
    """
    parser.formatter_class = _DefaultsFormatter
    for action in parser._actions:  # argparse has no public accessor
        if action.help is None and action.option_strings and action.default not in (
                None, False, argparse.SUPPRESS, []):
            action.help = "default: %(default)s"  # argparse shows no line without help
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_prog=sub.prog)
                _record_prog(sub)


def report_error(err: BaseException, args: argparse.Namespace) -> int | None:
    """Prints ``err`` as one ``error:`` line and returns the exit status; None for a bug.

    The library names its Python parameters in backticks (`` `head_chunk_size` ``); on the
    command line they are flags, so a name that is one of ``args`` is shown as its flag.

    Example:
        >>> import argparse
        >>> args = argparse.Namespace(command_prog="spectral-jax bench speed", head_chunk_size=0)
        >>> report_error(UsageError("`head_chunk_size` must be a positive int; got 0."), args)
        2
    """
    status = getattr(err, "exit_status", None)
    if status is None and isinstance(err, _USAGE_ERRORS):
        status = 2
    if status is None:
        return None
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    text = " ".join(line.strip() for line in str(text).splitlines() if line.strip())
    for name in vars(args):
        text = text.replace(f"`{name}`", f"`--{name.replace('_', '-')}`")
    prog = getattr(args, "command_prog", "spectral-jax")
    print(f"{prog}: error: {text}", file=sys.stderr)
    return int(status)


def main(argv: list[str] | None = None) -> int:
    """Runs ``spectral-jax ARGV``; returns the exit status (0, 1 or 2)."""
    if missing := missing_dependencies():
        print(f"spectral-jax: error: needs {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Exception as err:  # sorted by report_error; a bug is re-raised
        status = report_error(err, args)
        if status is None:
            raise
        return status


if __name__ == "__main__":
    sys.exit(main())
