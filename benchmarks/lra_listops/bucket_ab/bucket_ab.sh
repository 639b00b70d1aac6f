#!/usr/bin/env bash
# Examples/s of the LRA-length Gated DeltaNet recipe (small protocol) with and without
# length buckets, 60 steps each from scratch, run one after the other.
# Usage: bucket_ab.sh DATA_DIR [RUNS_DIR]; DATA_DIR holds LRA-length ListOps (the README's
# generator command), RUNS_DIR (default runs/bucket_ab) gets bk_0/ and bk_256/.
data=$1
runs=${2:-runs/bucket_ab}
mkdir -p "$runs"
for b in 0 256; do
  rm -rf "$runs/bk_$b"
  s=$(date +%s)
  spectral-jax train --config lra/listops:attention=gated_deltanet,protocol=small \
    --config.data.dir="$data" --config.train.steps=60 \
    --config.train.log_every=10 --config.train.eval_every=60 --config.train.eval_steps=2 \
    --config.train.bucket_multiple=$b --workdir "$runs/bk_$b" > "$runs/bk_$b.log" 2>&1
  echo "bucket_multiple=$b rc=$? wall=$(( $(date +%s) - s ))"
done
