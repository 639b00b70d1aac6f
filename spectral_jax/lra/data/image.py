"""Image (LRA): 10-way classification of flattened grayscale images, pixels as tokens.

Sources: CIFAR-10 (Krizhevsky 2009) as in LRA `lra_benchmarks/image/input_pipeline.py`
(`tf.image.rgb_to_grayscale`, train[:90%] / train[90%:] / test); Fashion-MNIST
(Xiao et al. 2017) IDX files, the locally installable stand-in (`dataset-fashion-mnist`).
"""

from __future__ import annotations

import gzip
import os
import pickle
import warnings
from pathlib import Path

import numpy as np

from spectral_jax import UsageError, UsageTypeError
from spectral_jax.lra.data.task import Split, Task

VOCAB_SIZE = 256  # pixel values 0..255 are the tokens.
NUM_CLASSES = 10
SOURCES = ("auto", "fashion_mnist", "cifar10")
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions.
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension.
# ITU-R 601-2 luma weights, as tf.image.rgb_to_grayscale.
_LUMA = np.array([0.2989, 0.5870, 0.1140], np.float32)
_VAL_FRACTION = 0.1  # LRA: train[:90%] / train[90%:].


def rgb_to_gray(rgb: np.ndarray) -> np.ndarray:
    """Grayscale exactly as LRA's `tf.image.rgb_to_grayscale` on uint8 images.

    TF computes luma = sum_c w_c * (x_c / 255) in float32 and converts back to uint8 as
    trunc(luma * 255.5) (`convert_image_dtype`), i.e. round-to-nearest up to float32
    error.

    Args:
        rgb: uint8 [..., 3] images.

    Returns:
        uint8 [...] gray values.

    Raises:
        spectral_jax.UsageError: if the last axis is not 3.

    Example:
        >>> rgb_to_gray(np.array([[255, 255, 255], [10, 20, 30]], np.uint8)).tolist()
        [255, 18]
    """
    if rgb.shape[-1] != 3:
        raise UsageError(f"rgb_to_gray: last axis must be 3 (RGB), got shape {rgb.shape}")
    luma = (rgb.astype(np.float32) * np.float32(1 / 255)) @ _LUMA
    return (luma * np.float32(255.5)).astype(np.uint8)


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Reads one `cifar-10-batches-py` pickle (keys b"data", b"labels").

    Args:
        path: e.g. `cifar-10-batches-py/data_batch_1`.

    Returns:
        (uint8 [N, 32, 32, 3] RGB images, int32 [N] labels 0..9).

    Raises:
        FileNotFoundError: if `path` is missing.
        spectral_jax.UsageError: if it is not a CIFAR-10 python pickle (keys, shapes, label range).

    Example:
        >>> import pathlib, pickle, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "test_batch"
        >>> _ = p.write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8),
        ...                                 b"labels": [7]}))
        >>> read_cifar_batch(p)[0].shape
        (1, 32, 32, 3)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR-10 batch file not found: {path}")
    with open(path, "rb") as f:
        try:
            batch = pickle.load(f, encoding="bytes")
        except Exception as err:
            raise UsageError(f"{path}: not a CIFAR-10 python pickle ({err})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = list(batch) if isinstance(batch, dict) else type(batch).__name__
        raise UsageError(f'{path}: expected a dict with keys b"data" and b"labels", got {keys}')
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise UsageError(f'{path}: b"data" must be uint8 [N, 3072], got {data.dtype} {data.shape}')
    if labels.shape != (data.shape[0],) or labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise UsageError(f'{path}: b"labels" must be {data.shape[0]} ints in 0..9')
    # Rows are [1024 red, 1024 green, 1024 blue], each plane row-major 32x32.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return images, labels.astype(np.int32)


def read_idx(path: str | os.PathLike, magic: int) -> np.ndarray:
    """Reads an IDX file (gzip-compressed if it ends in `.gz`) of unsigned bytes.

    Format (LeCun's MNIST page): big-endian int32 magic (0x0000 08 ndim), ndim int32
    sizes, then the uint8 data.

    Args:
        path: IDX file.
        magic: expected magic number (2051 for images, 2049 for labels).

    Returns:
        uint8 array of the shape given in the header.

    Raises:
        FileNotFoundError: if `path` is missing.
        spectral_jax.UsageError: on a wrong magic number, a data size that disagrees with
            the header, or a corrupt gzip stream.

    Example:
        >>> import gzip, pathlib, tempfile
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "labels-idx1-ubyte.gz"
        >>> _ = p.write_bytes(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 2, 3, 4])))
        >>> read_idx(p, IDX_LABELS_MAGIC).tolist()
        [3, 4]
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (EOFError, OSError) as err:  # truncated or not gzip at all
        raise UsageError(f"{path}: cannot read IDX data ({err})") from None
    got = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if got != magic:
        raise UsageError(
            f"{path}: wrong IDX magic number {got} (0x{got or 0:08x}); expected {magic} "
            f"(0x{magic:08x}, uint8 data with {magic & 0xFF} dimensions)"
        )
    ndim = magic & 0xFF
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise UsageError(
            f"{path}: header shape {shape} needs {int(np.prod(shape))} bytes of data, "
            f"file has {data.size}"
        )
    return data.reshape(shape)


def _split_train(images: np.ndarray, labels: np.ndarray) -> tuple:
    cut = round(len(labels) * (1 - _VAL_FRACTION))
    return (images[:cut], labels[:cut]), (images[cut:], labels[cut:])


def _find_cifar(data_dir: Path) -> Path | None:
    for cand in (data_dir / "cifar-10-batches-py", data_dir):
        if (cand / "data_batch_1").is_file():
            return cand
    return None


def _find_fashion(data_dir: Path) -> Path | None:
    for cand in (data_dir, data_dir / "fashion-mnist", SYSTEM_FASHION_MNIST):
        if (cand / FASHION_FILES["train_images"]).is_file():
            return cand
    return None


def _load_cifar(folder: Path) -> tuple[dict, int]:
    batches = [read_cifar_batch(folder / name) for name in CIFAR_TRAIN_FILES]
    train = (np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))
    test = read_cifar_batch(folder / "test_batch")
    (tr, va) = _split_train(*train)
    parts = {"train": tr, "validation": va, "test": test}
    return {k: (rgb_to_gray(x).reshape(len(x), -1), y) for k, (x, y) in parts.items()}, 1024


def _load_fashion(folder: Path) -> tuple[dict, int]:
    arrays = {}
    for key, name in FASHION_FILES.items():
        magic = IDX_IMAGES_MAGIC if key.endswith("images") else IDX_LABELS_MAGIC
        arrays[key] = read_idx(folder / name, magic)
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.shape[0] != labels.shape[0]:
            raise UsageError(
                f"Fashion-MNIST {part}: {images.shape[0]} images in "
                f"{folder / FASHION_FILES[part + '_images']} but {labels.shape[0]} labels in "
                f"{folder / FASHION_FILES[part + '_labels']}"
            )
        if labels.max() >= NUM_CLASSES:
            raise UsageError(
                f"{folder / FASHION_FILES[part + '_labels']}: labels must be 0..9, "
                f"got {labels.max()}"
            )
    tr, va = _split_train(arrays["train_images"], arrays["train_labels"])
    parts = {"train": tr, "validation": va, "test": (arrays["test_images"], arrays["test_labels"])}
    length = arrays["train_images"].shape[1] * arrays["train_images"].shape[2]
    return {k: (x.reshape(len(x), -1), y.astype(np.int32)) for k, (x, y) in parts.items()}, length


def load(
    data_dir: str | os.PathLike, *, source: str = "auto", mask_zero_pixels: bool = False,
    test_examples: int | None = None,
) -> Task:
    """Loads the Image task: CIFAR-10 grayscale (1024 tokens) or Fashion-MNIST (784).

    `source="auto"` uses CIFAR-10 python pickles if `data_dir/cifar-10-batches-py/` (or
    `data_dir` itself) has them, else Fashion-MNIST IDX `.gz` files from `data_dir`,
    `data_dir/fashion-mnist/` or `/usr/share/datasets/fashion-mnist/` (Debian package
    `dataset-fashion-mnist`). Splits: first 90% of the training files / last 10% / the
    test files (CIFAR 45k/5k/10k, Fashion-MNIST 54k/6k/10k), images flattened row-major.

    Args:
        data_dir: where to look (see above).
        source: "auto", "cifar10" or "fashion_mnist".
        mask_zero_pixels: if True, mask = pixel != 0 (LRA's quirk: black pixels treated
            as padding); default False: every pixel is a valid token.
        test_examples: keep only the first this many test images (None: all). The CPU
            preset evaluates on 2,000 of Fashion-MNIST's 10,000, whose first 2,000 hold
            188-219 images of each class.

    Returns:
        Task "image": inputs int32 [N, 1024 or 784] in 0..255, vocab 256, 10 classes.

    Raises:
        FileNotFoundError: if the chosen source's files are missing.
        spectral_jax.UsageError: on an unknown `source`, a non-positive `test_examples` or a
            malformed file (named in the message).

    Example:
        >>> t = load("/nonexistent", source="fashion_mnist")  # doctest: +SKIP
        >>> t.splits["test"].inputs.shape  # doctest: +SKIP
        (10000, 784)
    """
    if source not in SOURCES:
        raise UsageError(f"image: source must be one of {SOURCES}, got {source!r}")
    if not isinstance(mask_zero_pixels, bool):
        raise UsageTypeError(f"image: mask_zero_pixels must be a bool, got {mask_zero_pixels!r}")
    if test_examples is not None and (
            isinstance(test_examples, bool)
            or not isinstance(test_examples, (int, np.integer)) or test_examples < 1):
        raise UsageError(f"image: test_examples must be a positive int or None, got "
                         f"{test_examples!r}")
    data_dir = Path(data_dir)
    cifar = _find_cifar(data_dir) if source in ("auto", "cifar10") else None
    fashion = _find_fashion(data_dir) if source in ("auto", "fashion_mnist") and not cifar else None
    if cifar is not None:
        parts, length = _load_cifar(cifar)
        where = f"cifar10 pickles in {cifar}"
    elif fashion is not None:
        if source == "auto":
            # A mistyped CIFAR-10 path must not pass unnoticed as a CIFAR-10 result.
            warnings.warn(f"image: no CIFAR-10 pickles in {data_dir}; source='auto' uses "
                          f"Fashion-MNIST from {fashion}", stacklevel=2)
        parts, length = _load_fashion(fashion)
        where = f"fashion_mnist IDX in {fashion}"
    else:
        wanted = {
            "cifar10": f"{data_dir / 'cifar-10-batches-py'}/data_batch_1..5 + test_batch "
                       "(untar cifar-10-python.tar.gz there)",
            "fashion_mnist": f"{', '.join(FASHION_FILES.values())} in {data_dir} or "
                             f"{SYSTEM_FASHION_MNIST} (`apt-get install dataset-fashion-mnist`)",
        }
        names = ("cifar10", "fashion_mnist") if source == "auto" else (source,)
        raise FileNotFoundError(
            f"image ({source}): data not found; expected " + "; or ".join(wanted[n] for n in names)
        )
    if test_examples is not None:
        pixels, labels = parts["test"]
        parts["test"] = (pixels[:int(test_examples)], labels[:int(test_examples)])
    splits = {}
    for split, (pixels, labels) in parts.items():
        inputs = pixels.astype(np.int32)
        mask = inputs != 0 if mask_zero_pixels else np.ones(inputs.shape, bool)
        splits[split] = Split(inputs, mask, labels)
    return Task("image", VOCAB_SIZE, NUM_CLASSES, length, False, splits, source=where,
                truncated={k: 0 for k in splits})
