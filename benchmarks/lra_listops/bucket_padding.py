"""How many tokens length-bucketed batches compute, against batches of one fixed length.

    python benchmarks/lra_listops/bucket_padding.py DATA_DIR [--max-length 2000]

For the training split in DATA_DIR (ListOps TSVs), prints the share of valid tokens at the
fixed length, and for a few (multiple, window) settings of `train.bucket_multiple` /
`train.bucket_window` the tokens the first 960 batches of 32 compute (a fraction of the
fixed length's) and the valid share of those. No model runs.
"""

from __future__ import annotations

import argparse
import itertools

from spectral_jax.lra.data import iterate_length_buckets, load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("--max-length", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=960)
    args = parser.parse_args()
    split = load_task("listops", args.data_dir, max_length=args.max_length).splits["train"]
    print(f"{len(split)} examples; valid tokens at length {split.mask.shape[-1]}: "
          f"{split.mask.sum() / split.mask.size:.1%}")
    for multiple, window in ((256, 32), (128, 32), (256, 8)):
        batches = list(itertools.islice(iterate_length_buckets(
            split, 32, multiple=multiple, window=window, seed=0), args.batches))
        computed = sum(b["mask"].size for b in batches)
        valid = sum(int(b["mask"].sum()) for b in batches)
        print(f"multiple {multiple}, window {window}: "
              f"{computed / (args.batches * 32 * split.mask.shape[-1]):.1%} of the fixed "
              f"length's tokens, {valid / computed:.1%} of them valid")


if __name__ == "__main__":
    main()
