"""Image task: CIFAR-10 python pickles (LRA grayscale) and Fashion-MNIST IDX files."""

from __future__ import annotations

import gzip
import pickle

import chex
import numpy as np
import pytest

from spectral_jax.lra import data
from spectral_jax.lra.data import image


def _write_cifar(folder, n_per_batch: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    written = {}
    for name in (*image.CIFAR_TRAIN_FILES, "test_batch"):
        rows = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n_per_batch).tolist()
        batch = {b"batch_label": name.encode(), b"data": rows, b"labels": labels,
                 b"filenames": [b"x.png"] * n_per_batch}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = rows
    return written


def test_rgb_to_gray_matches_tf_formula() -> None:
    rgb = np.array([[255, 255, 255], [0, 0, 0], [10, 20, 30], [255, 0, 0], [1, 1, 1]], np.uint8)
    # trunc(255.5 * sum(w * x / 255)) with w = (0.2989, 0.5870, 0.1140), as TF does.
    with np.errstate(all="raise"):
        ref = np.trunc(255.5 * (rgb.astype(np.float64) / 255) @ [0.2989, 0.5870, 0.1140])
    assert image.rgb_to_gray(rgb).tolist() == ref.astype(int).tolist() == [255, 0, 18, 76, 1]


def test_cifar_round_trip_grayscale_and_split(tmp_path) -> None:
    written = _write_cifar(tmp_path / "cifar-10-batches-py")
    task = data.load_task("image", tmp_path)  # auto picks CIFAR when present
    assert "cifar10" in task.source
    assert (task.vocab_size, task.num_classes, task.max_length) == (256, 10, 1024)
    assert [len(s) for s in task.splits.values()] == [18, 2, 4]  # 90% / 10% of 20, test 4
    row = written["data_batch_1"][0]
    r, g, b = (row[i * 1024:(i + 1) * 1024].astype(np.float64) / 255 for i in range(3))
    want = np.trunc(255.5 * (0.2989 * r + 0.5870 * g + 0.1140 * b)).astype(np.int32)
    got = task.splits["train"].inputs[0]
    assert np.abs(got - want).max() <= 1  # float32 vs float64 rounding at the boundary
    assert (got == want).mean() > 0.99
    assert task.splits["train"].mask.all()  # pixel 0 is a valid token by default
    last_val = written["data_batch_5"][-1]
    chex.assert_shape(task.splits["validation"].inputs, (2, 1024))
    assert task.splits["validation"].inputs[-1].tolist() == image.rgb_to_gray(
        last_val.reshape(3, 32, 32).transpose(1, 2, 0)).reshape(-1).tolist()


def test_cifar_bad_pickle_names_file(tmp_path) -> None:
    _write_cifar(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(
        pickle.dumps({b"images": np.zeros((1, 3072), np.uint8)}))
    with pytest.raises(ValueError, match=r"data_batch_3: expected a dict with keys"):
        data.load_task("image", tmp_path, source="cifar10")


def _idx(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def _write_fashion(folder, n_train: int = 20, n_test: int = 5) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28)),
        "train_labels": np.arange(n_train) % 10,
        "test_images": rng.integers(0, 256, (n_test, 28, 28)),
        "test_labels": np.arange(n_test) % 10,
    }
    for key, arr in arrays.items():
        magic = image.IDX_IMAGES_MAGIC if key.endswith("images") else image.IDX_LABELS_MAGIC
        (folder / image.FASHION_FILES[key]).write_bytes(_idx(arr, magic))
    return arrays


def test_fashion_idx_round_trip_and_zero_pixel_flag(tmp_path) -> None:
    arrays = _write_fashion(tmp_path)
    arrays["train_images"][0, 0, :3] = 0
    (tmp_path / image.FASHION_FILES["train_images"]).write_bytes(
        _idx(arrays["train_images"], image.IDX_IMAGES_MAGIC))
    task = data.load_task("image", tmp_path, source="fashion_mnist")
    assert task.max_length == 784 and "fashion_mnist" in task.source
    assert [len(s) for s in task.splits.values()] == [18, 2, 5]
    np.testing.assert_array_equal(task.splits["train"].inputs, arrays["train_images"][:18]
                                  .reshape(18, -1))
    np.testing.assert_array_equal(task.splits["validation"].labels, [8, 9])
    assert task.splits["train"].mask.all()
    masked = data.load_task("image", tmp_path, source="fashion_mnist", mask_zero_pixels=True)
    assert masked.splits["train"].mask[0, :3].tolist() == [False] * 3
    np.testing.assert_array_equal(masked.splits["test"].mask, masked.splits["test"].inputs != 0)
    first = data.load_task("image", tmp_path, source="fashion_mnist", test_examples=3)
    assert [len(s) for s in first.splits.values()] == [18, 2, 3]
    np.testing.assert_array_equal(first.splits["test"].inputs,
                                  arrays["test_images"][:3].reshape(3, -1))
    np.testing.assert_array_equal(first.splits["test"].labels, arrays["test_labels"][:3])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"test_examples must be a positive int or None"):
            data.load_task("image", tmp_path, source="fashion_mnist", test_examples=bad)


def test_idx_wrong_magic_and_size_name_the_file(tmp_path) -> None:
    _write_fashion(tmp_path)
    path = tmp_path / image.FASHION_FILES["test_labels"]
    path.write_bytes(_idx(np.arange(5), 2050))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: wrong IDX magic number "
                                         r"2050.*expected 2049"):
        data.load_task("image", tmp_path, source="fashion_mnist")
    path.write_bytes(_idx(np.arange(5), image.IDX_LABELS_MAGIC)[:-3])
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: cannot read IDX"):
        data.load_task("image", tmp_path, source="fashion_mnist")
    raw = image.IDX_LABELS_MAGIC.to_bytes(4, "big") + (7).to_bytes(4, "big") + bytes(5)
    path.write_bytes(gzip.compress(raw))
    with pytest.raises(ValueError, match=r"header shape \(7,\) needs 7 bytes.*has 5"):
        data.load_task("image", tmp_path, source="fashion_mnist")


def test_image_missing_data_and_bad_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(image, "SYSTEM_FASHION_MNIST", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py.*dataset-fashion-mnist"):
        data.load_task("image", tmp_path)
    with pytest.raises(ValueError, match="source must be one of"):
        data.load_task("image", tmp_path, source="mnist")


@pytest.mark.skipif(not (image.SYSTEM_FASHION_MNIST / image.FASHION_FILES["train_images"])
                    .is_file(), reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_from_debian_package(tmp_path) -> None:
    # An empty dir: auto falls back to the system copy, and says so.
    with pytest.warns(UserWarning,
                      match="no CIFAR-10 pickles in .*; source='auto' uses Fashion-MNIST"):
        task = data.load_task("image", tmp_path)
    assert [len(s) for s in task.splits.values()] == [54000, 6000, 10000]
    chex.assert_shape(task.splits["test"].inputs, (10000, 784))
    assert np.bincount(task.splits["test"].labels).tolist() == [1000] * 10
    assert task.splits["train"].inputs.max() == 255 and task.splits["train"].inputs.min() == 0
    assert 0.1 <= data.majority_baseline(task.splits["train"]) < 0.11
