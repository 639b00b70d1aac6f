"""Pathfinder: release-layout reader (PNG + text metadata) and the seeded generator."""

from __future__ import annotations

import chex
import numpy as np
import pytest
from PIL import Image

from spectral_jax.lra import data
from spectral_jax.lra.data import _snakes, pathfinder


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("pf")
    stats = pathfinder.generate(out, num_images=30, seed=7)
    return out, stats


def test_generator_writes_release_layout_balanced(generated) -> None:
    out, stats = generated
    folder = out / "pathfinder32" / "curv_contour_length_14"
    assert stats["images"] == 30 and stats["positives"] == 15
    lines = (folder / "metadata" / "0.npy").read_text().splitlines()
    assert len(lines) == 30
    first = lines[0].split()
    assert first[:3] == ["imgs/0", "sample_0.png", "0"] and first[3] in ("0", "1")
    assert first[5] == "14" and len(first) == 11  # release column count
    with Image.open(folder / "imgs" / "0" / "sample_0.png") as img:
        assert img.mode == "L" and img.size == (32, 32)


def test_generated_images_round_trip_and_splits(generated) -> None:
    out, _ = generated
    task = data.load_task("pathfinder", out)
    assert (task.name, task.vocab_size, task.num_classes, task.max_length) == (
        "pathfinder", 256, 2, 1024)
    assert [len(s) for s in task.splits.values()] == [24, 3, 3]
    folder = out / "pathfinder32" / "curv_contour_length_14"
    rows = (folder / "metadata" / "0.npy").read_text().splitlines()
    for i in (0, 25, 29):  # train, validation, test rows in metadata order
        sub, name, _, label = rows[i].split()[:4]
        split, j = [("train", i), ("validation", i - 24), ("test", i - 27)][(i >= 24) + (i >= 27)]
        want = np.asarray(Image.open(folder / sub / name)).reshape(-1)
        np.testing.assert_array_equal(task.splits[split].inputs[j], want)
        assert task.splits[split].labels[j] == int(label)
    labels = np.concatenate([s.labels for s in task.splits.values()])
    assert labels.sum() == 15
    assert task.splits["train"].mask.all()
    masked = data.load_task("pathfinder", out, mask_zero_pixels=True)
    np.testing.assert_array_equal(masked.splits["test"].mask, masked.splits["test"].inputs != 0)
    assert 0.5 < (masked.splits["train"].inputs == 0).mean() < 0.95  # mostly background


def test_generator_same_seed_same_files(generated, tmp_path) -> None:
    out, _ = generated
    pathfinder.generate(tmp_path, num_images=30, seed=7)
    rel = "pathfinder32/curv_contour_length_14"
    meta = f"{rel}/metadata/0.npy"
    assert (out / meta).read_bytes() == (tmp_path / meta).read_bytes()
    a = data.load_task("pathfinder", out).splits["train"].inputs
    b = data.load_task("pathfinder", tmp_path).splits["train"].inputs
    chex.assert_trees_all_equal(a, b)


def test_generator_class_balance_and_folders(tmp_path, monkeypatch) -> None:
    # Drawing is stubbed out: this checks labelling, balance and the 1000-per-folder split.
    monkeypatch.setattr(pathfinder, "draw",
                        lambda rng, p, label: np.full((32, 32), label, np.uint8))
    stats = pathfinder.generate(tmp_path, num_images=1001, seed=0, difficulty="curv_baseline")
    assert stats["positives"] in (500, 501)
    folder = tmp_path / "pathfinder32" / "curv_baseline"
    assert len((folder / "metadata" / "1.npy").read_text().splitlines()) == 1
    task = data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")
    for split in task.splits.values():
        assert 0.45 <= split.labels.mean() <= 0.55
        np.testing.assert_array_equal(split.inputs[:, 0], split.labels)  # label drawn = listed


@pytest.mark.parametrize("label", [0, 1])
def test_marker_placement_matches_label(label: int) -> None:
    p = _snakes.SnakeParams.for_resolution(32, 9)
    rng = np.random.default_rng(label)
    contours = []
    blocked = np.zeros((32, 32), bool)
    for n in (9, 9):
        paddles, cells = _snakes._grow(rng, p, n, blocked)
        contours.append(paddles)
        blocked |= cells
    ends = _snakes._marker_ends(contours, label)
    np.testing.assert_allclose(ends[0], contours[0][0][0])
    np.testing.assert_allclose(ends[1], contours[0 if label else 1][-1][1])
    img = _snakes.draw(np.random.default_rng(3), p, label)
    assert img.shape == (32, 32) and img.max() == 255 and (img == 0).mean() > 0.5


def _write_release(root, rows: list[tuple[str, int]], size: int = 32) -> None:
    folder = root / "pathfinder32" / "curv_baseline"
    (folder / "metadata").mkdir(parents=True)
    (folder / "imgs" / "0").mkdir(parents=True)
    lines = []
    for n, (name, label) in enumerate(rows):
        pixels = np.full((size, size), n * 10, np.uint8)
        Image.fromarray(pixels).save(folder / "imgs" / "0" / name)
        lines.append(f"imgs/0 {name} {n} {label} 1.0 6 2 2 0.5 1 1\n")
    (folder / "metadata" / "0.npy").write_text("".join(lines))


def test_reader_round_trips_release_layout(tmp_path) -> None:
    rows = [(f"sample_{i}.png", i % 2) for i in range(10)]
    _write_release(tmp_path, rows)
    task = data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")
    assert [len(s) for s in task.splits.values()] == [8, 1, 1]
    assert task.splits["train"].inputs[:, 0].tolist() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert task.splits["test"].inputs[0, 0] == 90 and task.splits["test"].labels.tolist() == [1]
    assert task.splits["train"].mask[0].all()  # pixel 0 is valid unless mask_zero_pixels


def test_reader_metadata_row_with_missing_image(tmp_path) -> None:
    _write_release(tmp_path, [("sample_0.png", 0), ("sample_1.png", 1)])
    meta = tmp_path / "pathfinder32" / "curv_baseline" / "metadata" / "0.npy"
    meta.write_text(meta.read_text() + "imgs/0 sample_9.png 2 1 1.0 6 2 2 0.5 1 1\n")
    with pytest.raises(FileNotFoundError, match=r"0\.npy:3: metadata row points to a missing "
                                                r"image .*sample_9\.png"):
        data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")


@pytest.mark.parametrize(
    "line, match",
    [("imgs/0 sample_0.png 2", r"0\.npy:2: expected >= 4"),
     ("imgs/0 sample_0.png 2 7", r"0\.npy:2: label \(column 3\) must be 0 or 1"),
     ("imgs/0 sample_0.png 0 0",
      r"0\.npy:2: image .*sample_0\.png is already listed at .*0\.npy:1")],
)
def test_reader_bad_metadata_rows(tmp_path, line, match) -> None:
    _write_release(tmp_path, [("sample_0.png", 0)])
    meta = tmp_path / "pathfinder32" / "curv_baseline" / "metadata" / "0.npy"
    meta.write_text(meta.read_text() + line + "\n")
    with pytest.raises(ValueError, match=match):
        data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")


def test_reader_empty_png_raises_or_is_skipped_with_warning(tmp_path) -> None:
    _write_release(tmp_path, [(f"sample_{i}.png", i % 2) for i in range(10)])
    (tmp_path / "pathfinder32" / "curv_baseline" / "imgs" / "0" / "sample_3.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"0\.npy:4: cannot decode image .*sample_3\.png"):
        data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        task = data.load_task("pathfinder", tmp_path, difficulty="curv_baseline",
                              skip_unreadable=True)
    assert sum(len(s) for s in task.splits.values()) == 9


def test_reader_wrong_image_size(tmp_path) -> None:
    _write_release(tmp_path, [("sample_0.png", 0)], size=16)
    with pytest.raises(ValueError, match=r"sample_0\.png is 16x16, expected 32x32"):
        data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")


def test_unknown_difficulty_and_missing_folder(tmp_path) -> None:
    with pytest.raises(ValueError,
                       match="`difficulty` must be one of .*curv_contour_length_14.*; got 'hard'"):
        data.load_task("pathfinder", tmp_path, difficulty="hard")
    with pytest.raises(ValueError, match="`difficulty` must be one of"):
        pathfinder.generate(tmp_path, difficulty="curv_contour_length_10", num_images=2, seed=0)
    with pytest.raises(FileNotFoundError, match="spectral-jax data pathfinder --out .* "
                                                "--resolution 128"):
        data.load_task("pathx", tmp_path)


def test_reader_refuses_16_bit_images(tmp_path) -> None:
    _write_release(tmp_path, [("sample_0.png", 0)])
    path = tmp_path / "pathfinder32" / "curv_baseline" / "imgs" / "0" / "sample_0.png"
    Image.fromarray(np.full((32, 32), 40000, np.uint16)).save(path)
    with pytest.raises(ValueError,
                       match=r"sample_0\.png has 'I;16' pixels; Pathfinder images must be 8-bit"):
        data.load_task("pathfinder", tmp_path, difficulty="curv_baseline")
