"""`spectral-jax data ...` sub-commands."""

from __future__ import annotations

import argparse
import json

import pytest

from spectral_jax.lra import cli as entry_point
from spectral_jax.lra.cli import data as cli
from spectral_jax.lra.data import listops_generator


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spectral-jax")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_registers_one_data_command_with_three_subcommands() -> None:
    parser = _parser()
    args = parser.parse_args(["data", "listops", "--out", "d"])
    assert (args.train, args.val, args.test, args.seed, args.min_length, args.max_length) == (
        96000, 2000, 2000, 0, 500, 2000)
    assert parser.parse_args(["data", "pathfinder", "--out", "d"]).resolution == 32
    assert parser.parse_args(["data", "info", "listops", "--data-dir", "d"]).task == "listops"
    with pytest.raises(SystemExit):
        parser.parse_args(["data"])


def test_listops_then_info(tmp_path, capsys) -> None:
    args = _parser().parse_args([
        "data", "listops", "--out", str(tmp_path), "--train", "40", "--val", "5", "--test", "5",
        "--seed", "1", "--min-length", "20", "--max-length", "100"])
    assert args.func(args) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["train"], stats["validation"], stats["test"], stats["truncated"]) == (40, 5, 5, 0)
    rows = (tmp_path / "basic_train.tsv").read_text().splitlines()[1:]
    assert all(listops_generator.evaluate(r.split("\t")[0]) == int(r.split("\t")[1]) for r in rows)

    args = _parser().parse_args(["data", "info", "listops", "--data-dir", str(tmp_path),
                                 "--option", "max_length=100"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "vocab 17, classes 10, max_length 100" in out
    assert "train      n=40" in out and "inputs (40, 100)" in out and "truncated 0" in out


def test_pathfinder_command(tmp_path, capsys) -> None:
    args = _parser().parse_args(["data", "pathfinder", "--out", str(tmp_path), "--num-images",
                                 "4", "--difficulty", "curv_baseline", "--seed", "2"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["positives"] == 2
    assert len(list((tmp_path / "pathfinder32/curv_baseline/imgs/0").glob("*.png"))) == 4


def test_user_errors_print_one_line_and_exit_2(tmp_path, capsys) -> None:
    for argv, message in (
        (["info", "listops", "--data-dir", str(tmp_path), "--option", "maxlen=3"], "maxlen"),
        (["info", "listops", "--data-dir", str(tmp_path), "--option", "maxlen"],
         "--option must look like KEY=VALUE"),
        (["info", "listops", "--data-dir", str(tmp_path / "none")], "basic_train.tsv"),
        (["listops", "--out", str(tmp_path / "lo"), "--train", "0"],
         "`num_train` must be a positive int; got 0"),
        (["pathfinder", "--out", str(tmp_path / "pf"), "--difficulty", "hard"],
         "`--difficulty` must be one of"),
    ):
        assert entry_point.main(["data", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"spectral-jax data {argv[0]}: error: ") and message in err
        assert "Traceback" not in err and err.count("\n") == 1


def test_info_reads_the_data_as_the_config_does(tmp_path, capsys) -> None:
    # With --config, info reads the data at the config's length (the quick preset trains at
    # 128 tokens), not at the reader's default (2000).
    listops_generator.generate(str(tmp_path), num_train=8, num_val=2, num_test=2, seed=0,
                               min_length=20, max_length=100, max_depth=4, max_args=4)
    assert entry_point.main(["data", "info", "--config", "lra/listops:quick",
                             f"--config.data.dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "max_length 128 (the config lra/listops:quick)" in out
    assert "inputs (8, 128)" in out
    assert entry_point.main(["data", "info", "listops", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "max_length 2000 (the reader's default; a config may read at another length" in out
    assert entry_point.main(["data", "info", "text", "--config",
                             "lra/listops:quick"]) == 2
    assert "task 'text' differs from the config's task 'listops'" in capsys.readouterr().err
    assert entry_point.main(["data", "info", "listops"]) == 2
    assert "give TASK and --data-dir, or --config" in capsys.readouterr().err
