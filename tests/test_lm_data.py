"""The byte-level LM task: enwik8 / text8 readers on small files in their release format, the
90/5/5 split, the windows, and the licenses folder every Debian machine has."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from spectral_jax import UsageError
from spectral_jax.lra import data
from spectral_jax.lra.data import bytes_lm

# enwik8 is raw Wikipedia XML (any byte, UTF-8); text8 is a-z and single spaces, no newline.
ENWIK8 = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/">\n  <page>\n'
          '    <title>Anarchism</title>\n    <text xml:space="preserve">[[Image:x.svg|'
          'thumb]] \u00e9t\u00e9 &amp; more</text>\n  </page>\n').encode() * 20
TEXT8 = b" anarchism originated as a term of abuse first used against early working class" * 25


def _ids(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, np.uint8).astype(np.int32) + 1


def _rebuilt(split: data.Split) -> np.ndarray:
    """The split's ids from its windows: the first window whole, then each window's tail."""
    rows = [split.inputs[0][split.mask[0]]]
    rows += [row[1:][m[1:]] for row, m in zip(split.inputs[1:], split.mask[1:])]
    return np.concatenate(rows)


@pytest.mark.parametrize("corpus, raw", [("enwik8", ENWIK8), ("text8", TEXT8)])
def test_release_file_split_90_5_5_and_windows(tmp_path, corpus, raw):
    (tmp_path / corpus).write_bytes(raw)
    task = data.load_task("bytes_lm", tmp_path, corpus=corpus, context_length=16)
    held = round(0.05 * len(raw))
    parts = {"train": raw[:len(raw) - 2 * held], "validation": raw[-2 * held:-held],
             "test": raw[-held:]}
    assert task.max_length == 17 and task.vocab_size == task.num_classes == 257
    for name, part in parts.items():
        split = task.splits[name]
        # Every byte of the part is in the windows once, in order, as byte + 1.
        np.testing.assert_array_equal(_rebuilt(split), _ids(part))
        assert len(split) == -(-(len(part) - 1) // 16)
        # Windows overlap by one: the next window starts with the previous one's last id.
        np.testing.assert_array_equal(split.inputs[1:, 0], split.inputs[:-1, -1])
        assert split.labels[-1] == _ids(part)[-1]
    assert task.splits["train"].mask[:-1].all()


def test_zip_archive_as_downloaded(tmp_path):
    with zipfile.ZipFile(tmp_path / "text8.zip", "w") as archive:
        archive.writestr("text8", TEXT8)
    from_zip = data.load_task("bytes_lm", tmp_path, corpus="text8", context_length=8)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "text8").write_bytes(TEXT8)
    # The file itself is accepted as data_dir too.
    from_file = data.load_task("bytes_lm", tmp_path / "raw" / "text8", corpus="text8",
                               context_length=8)
    for name in data.SPLIT_NAMES:
        np.testing.assert_array_equal(from_zip.splits[name].inputs, from_file.splits[name].inputs)


def test_folder_corpus_sorted_symlinks_once(tmp_path):
    (tmp_path / "b").write_bytes(b"bbbb")
    (tmp_path / "a").write_bytes(b"aaaa")
    os.symlink(tmp_path / "a", tmp_path / "c")
    raw, source = bytes_lm.read_corpus(tmp_path, "folder")
    assert raw == b"aaaa\nbbbb" and source.startswith("2 files")


def test_missing_and_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="mattmahoney.net/dc/enwik8.zip"):
        data.load_task("bytes_lm", tmp_path, corpus="enwik8")
    with pytest.raises(FileNotFoundError, match="no folder"):
        data.load_task("bytes_lm", tmp_path / "nothing")
    with pytest.raises(UsageError, match="`corpus` must be one of"):
        data.load_task("bytes_lm", tmp_path, corpus="wiki103")
    (tmp_path / "f").write_bytes(b"abc")
    with pytest.raises(UsageError, match="3 bytes with heldout_fraction=0.05"):
        data.load_task("bytes_lm", tmp_path)
    with pytest.raises(UsageError, match="heldout_fraction"):
        data.load_task("bytes_lm", tmp_path, heldout_fraction=0.5)


@pytest.mark.skipif(not os.path.isdir(bytes_lm.LICENSES_DIR),
                    reason=f"{bytes_lm.LICENSES_DIR} (Debian base-files) is absent")
def test_licenses_corpus():
    task = data.load_task("bytes_lm", bytes_lm.LICENSES_DIR, context_length=256)
    raw, _ = bytes_lm.read_corpus(bytes_lm.LICENSES_DIR, "folder")
    assert b"GNU GENERAL PUBLIC LICENSE" in raw and len(raw) > 100_000
    total = sum(int(s.mask.sum()) for s in task.splits.values())
    # Each split's windows share one id between neighbours.
    assert total - sum(len(s) - 1 for s in task.splits.values()) == len(raw)
    # The majority baseline is the share of the most frequent byte (a space) among labels.
    test = task.splits["test"]
    assert data.majority_baseline(test) == pytest.approx(
        np.mean(test.labels == ord(" ") + 1))
