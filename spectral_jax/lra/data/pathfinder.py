"""Pathfinder / Path-X (LRA): release-layout reader and a seeded generator.

Sources: Linsley et al. 2018 (hGRU, NeurIPS) and Kim*, Linsley* et al. 2020 (ICLR),
generator `drewlinsley/pathfinder`; LRA `lra_benchmarks/data/pathfinder.py` and
`image/input_pipeline.py` (pathfinder32 / pathfinder128, "hard" = contour length 14).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from spectral_jax import UsageError, UsageTypeError, _checks
from spectral_jax.lra.data._snakes import SnakeParams, draw
from spectral_jax.lra.data.task import Split, Task
from spectral_jax.lra.data.tokens import check_positive_int

VOCAB_SIZE = 256
# Difficulty folder -> contour length (paddles per target contour).
DIFFICULTIES = {"curv_baseline": 6, "curv_contour_length_9": 9, "curv_contour_length_14": 14}
IMAGES_PER_DIR = 1000  # the release stores imgs/<k>/ with 1000 images each.
_SPLIT_FRACTIONS = (0.8, 0.1)  # LRA: [:80%], [80%:90%], [90%:].
PATHX_RESOLUTION = 128
PATHX_WARNING = (
    "Path-X (pathfinder128): the LRA release's pathfinder128 files are known to be broken "
    "(google-research/long-range-arena issue #38), so scores on them are not comparable; "
    "consider regenerating the split with `spectral-jax data pathfinder --resolution 128`.")
_warned_pathx = False


def _check_difficulty(difficulty: object) -> str:
    return str(_checks.choice("pathfinder", "difficulty", difficulty, DIFFICULTIES))


def _find_dir(data_dir: Path, resolution: int, difficulty: str) -> Path:
    cands = (data_dir / f"pathfinder{resolution}" / difficulty, data_dir / difficulty)
    for cand in cands:
        if (cand / "metadata").is_dir():
            return cand
    raise FileNotFoundError(
        f"Pathfinder data not found: no metadata/ folder in {cands[0]} or {cands[1]}. Copy the "
        f"LRA release's pathfinder{resolution}/ folder into {data_dir}, or generate it with "
        f"`spectral-jax data pathfinder --out {data_dir} --resolution {resolution} "
        f"--difficulty {difficulty}`."
    )


def read_metadata(folder: str | os.PathLike) -> list[tuple[Path, int, str]]:
    """Reads every `metadata/<k>.npy` (plain text despite the name) of a difficulty folder.

    Each non-blank line is space separated: `imgs/<k> sample_<n>.png <n> <label> ...`;
    columns 0-1 give the image path relative to `folder`, column 3 the label (1 = the
    markers are joined by one path). Files are read in numeric order of `<k>`.

    Args:
        folder: e.g. `pathfinder32/curv_contour_length_14`.

    Returns:
        [(image path, label, "metadata file:line")] in file and line order.

    Raises:
        FileNotFoundError: if `folder/metadata` has no `.npy` file.
        spectral_jax.UsageError: on a row with fewer than 4 columns, a label other than 0/1, or an
            image listed twice (which would break split disjointness); `file:line` named.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "metadata").mkdir()
        >>> _ = (d / "metadata" / "0.npy").write_text("imgs/0 sample_0.png 0 1 1.0 14\\n")
        >>> [(p.name, y) for p, y, _ in read_metadata(d)]
        [('sample_0.png', 1)]
    """
    folder = Path(folder)
    files = sorted((folder / "metadata").glob("*.npy"),
                   key=lambda f: (not f.stem.isdigit(), int(f.stem) if f.stem.isdigit() else 0,
                                  f.name))
    if not files:
        raise FileNotFoundError(f"Pathfinder: no metadata/*.npy files in {folder}")
    rows, seen = [], {}
    for meta in files:
        for line_num, line in enumerate(meta.read_text(encoding="utf-8").splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            where = f"{meta}:{line_num}"
            if len(fields) < 4:
                raise UsageError(
                    f"{where}: expected >= 4 space-separated columns (subdir, file, index, "
                    f"label, ...), got {len(fields)}: {line!r:.200}"
                )
            if fields[3] not in ("0", "1"):
                raise UsageError(f"{where}: label (column 3) must be 0 or 1, got {fields[3]!r}")
            path = folder / fields[0] / fields[1]
            if path in seen:
                raise UsageError(f"{where}: image {path} is already listed at {seen[path]}")
            seen[path] = where
            rows.append((path, int(fields[3]), where))
    return rows


class UndecodableImageError(ValueError):
    """An image file that PIL cannot decode (e.g. an empty PNG)."""


def _read_image(path: Path, where: str, resolution: int) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"{where}: metadata row points to a missing image {path}")
    try:
        with Image.open(path) as img:
            if img.mode.startswith(("I", "F")):
                # PIL would clip 16-bit or float values to 255, silently whitening the image.
                raise UsageError(f"{where}: image {path} has {img.mode!r} pixels; Pathfinder "
                                 "images must be 8-bit (grayscale or RGB)")
            pixels = np.asarray(img.convert("L"))
    except (UnidentifiedImageError, OSError) as err:
        raise UndecodableImageError(f"{where}: cannot decode image {path} ({err}); pass "
                                    "skip_unreadable=True to skip such images") from None
    if pixels.shape != (resolution, resolution):
        raise UsageError(
            f"{where}: image {path} is {pixels.shape[1]}x{pixels.shape[0]}, "
            f"expected {resolution}x{resolution}"
        )
    return pixels


def load(
    data_dir: str | os.PathLike,
    *,
    resolution: int = 32,
    difficulty: str = "curv_contour_length_14",
    mask_zero_pixels: bool = False,
    skip_unreadable: bool = False,
    name: str = "pathfinder",
) -> Task:
    """Loads Pathfinder from `pathfinder<R>/<difficulty>/{metadata,imgs}`.

    Splits are deterministic and disjoint: the metadata rows in order (files by number,
    lines in order) are cut 80% / 10% / 10% into train / validation / test, as LRA's
    `[:80%]`, `[80%:90%]`, `[90%:]`. Images are read as 8-bit grayscale (other PNG modes
    are converted with PIL's ITU-R 601 luma) and flattened row-major.

    Args:
        data_dir: folder holding `pathfinder<R>/` (or the `pathfinder<R>` folder itself).
        resolution: R (32 for Pathfinder, 128 for Path-X); sequences have R*R tokens.
        difficulty: "curv_baseline", "curv_contour_length_9" or "curv_contour_length_14".
        mask_zero_pixels: if True, mask = pixel != 0 (LRA's quirk, which hides most of
            the background); default False, every pixel is a valid token.
        skip_unreadable: if True, images that cannot be decoded (the release has an
            empty PNG in curv_baseline) are skipped with a warning giving their count and
            first path; default False raises.
        name: task name recorded in the result ("pathfinder" or "pathx").

    Returns:
        Task: inputs int32 [N, R*R] pixel values 0..255, vocab 256, 2 classes. Memory:
        4 bytes per pixel, e.g. 13 GB of inputs for 200k Path-X images.

    Raises:
        spectral_jax.UsageError: on an unknown difficulty, a malformed metadata row, an undecodable
            image (unless `skip_unreadable`) or an image of the wrong size.
        FileNotFoundError: if the folder is missing (message says how to generate it)
            or a metadata row points to a missing image (metadata file:line named).

    Warns:
        UserWarning: once per process, when the 128x128 split (Path-X) is loaded, naming
            the LRA release's known fault in it (long-range-arena issue #38).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = generate(d, num_images=10, seed=0)
        >>> load(d).splits["train"].inputs.shape
        (8, 1024)
    """
    difficulty = _check_difficulty(difficulty)
    resolution = check_positive_int(name, "resolution", resolution)
    for flag, value in (("mask_zero_pixels", mask_zero_pixels),
                        ("skip_unreadable", skip_unreadable)):
        if not isinstance(value, bool):
            raise UsageTypeError(f"{name}: {flag} must be a bool, got {value!r}")
    folder = _find_dir(Path(data_dir), resolution, difficulty)
    _warn_pathx_once(resolution)
    rows = read_metadata(folder)
    pixels = np.zeros((len(rows), resolution * resolution), np.uint8)
    labels = np.zeros(len(rows), np.int32)
    keep = np.ones(len(rows), bool)
    for i, (path, label, where) in enumerate(rows):
        try:
            pixels[i] = _read_image(path, where, resolution).reshape(-1)
        except UndecodableImageError:
            if not skip_unreadable:
                raise
            keep[i] = False
        labels[i] = label
    if not keep.all():
        first = rows[int(np.flatnonzero(~keep)[0])][0]
        warnings.warn(f"{name}: skipped {int((~keep).sum())} unreadable images (first: {first})",
                      stacklevel=2)
        pixels, labels = pixels[keep], labels[keep]
    n = len(labels)
    cut1, cut2 = int(n * _SPLIT_FRACTIONS[0]), int(n * sum(_SPLIT_FRACTIONS))
    splits = {}
    for split, sl in (("train", slice(0, cut1)), ("validation", slice(cut1, cut2)),
                      ("test", slice(cut2, n))):
        inputs = pixels[sl].astype(np.int32)
        mask = inputs != 0 if mask_zero_pixels else np.ones(inputs.shape, bool)
        splits[split] = Split(inputs, mask, labels[sl])
    return Task(name, VOCAB_SIZE, 2, resolution * resolution, False, splits,
                source=f"pathfinder PNG + metadata in {folder}", truncated={k: 0 for k in splits})


def _warn_pathx_once(resolution: int) -> None:
    global _warned_pathx
    if resolution == PATHX_RESOLUTION and not _warned_pathx:
        _warned_pathx = True
        warnings.warn(PATHX_WARNING, stacklevel=3)


def generate(
    out_dir: str | os.PathLike,
    *,
    resolution: int = 32,
    difficulty: str = "curv_contour_length_14",
    num_images: int,
    seed: int,
) -> dict:
    """Generates a class-balanced Pathfinder set in the release layout.

    Writes `out_dir/pathfinder<R>/<difficulty>/imgs/<k>/sample_<n>.png` (8-bit
    grayscale) and `metadata/<k>.npy` (plain text, one line per image:
    `imgs/<k> sample_<n>.png <n> <label> <continuity> <contour_length>
    <distractor_length> <paddle_length> <paddle_thickness> <paddle_margin> 1`), 1000
    images per folder, so `load` reads it back. Exactly floor(N/2) or ceil(N/2) images
    of each label, in a seeded random order. Label 1 puts the two markers on the ends of
    one contour, label 0 on ends of two different contours; the contour length
    (6 / 9 / 14 dashes) sets the difficulty. See `_snakes.py` for the drawing.

    Args:
        out_dir: root folder (created if needed; existing files are overwritten).
        resolution: image side R >= 32 (geometry scales with R / 32).
        difficulty: one of `DIFFICULTIES`.
        num_images: N >= 1.
        seed: numpy seed; same arguments give identical files.

    Returns:
        {"images", "positives", "seconds", "folder"}.

    Raises:
        ValueError / TypeError: on an unknown difficulty or bad sizes (message names it).

    Example:
        >>> import tempfile
        >>> generate(tempfile.mkdtemp(), num_images=4, seed=0)["positives"]
        2
    """
    start = time.perf_counter()
    difficulty = _check_difficulty(difficulty)
    resolution = check_positive_int("pathfinder.generate", "resolution", resolution)
    if resolution < 32:
        raise UsageError(f"pathfinder.generate: resolution must be >= 32, got {resolution}")
    num_images = check_positive_int("pathfinder.generate", "num_images", num_images)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"pathfinder.generate: seed must be an int >= 0, got {seed!r}")
    params = SnakeParams.for_resolution(resolution, DIFFICULTIES[difficulty])
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num_images) % 2)
    folder = Path(out_dir) / f"pathfinder{resolution}" / difficulty
    (folder / "metadata").mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for n, label in enumerate(labels.tolist()):
        k = n // IMAGES_PER_DIR
        sub = folder / "imgs" / str(k)
        if n % IMAGES_PER_DIR == 0:
            sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(draw(rng, params, label)).save(sub / f"sample_{n}.png")
        lines.append(
            f"imgs/{k} sample_{n}.png {n} {label} {params.max_turn:.4f} {params.contour_length} "
            f"{params.distractor_length} {params.paddle_length:g} {params.paddle_width:g} "
            f"{params.paddle_margin:g} 1\n"
        )
        if (n + 1) % IMAGES_PER_DIR == 0 or n + 1 == num_images:
            (folder / "metadata" / f"{k}.npy").write_text("".join(lines), encoding="utf-8")
            lines = []
    return {"images": num_images, "positives": int(labels.sum()),
            "seconds": time.perf_counter() - start, "folder": str(folder)}
