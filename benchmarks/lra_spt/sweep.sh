#!/usr/bin/env bash
# Quick ListOps, 4 methods x 2 seeds x {scratch, SPT, RoPE, RoPE+SPT}: four sweeps, one table.
# Usage: bash benchmarks/lra_spt/sweep.sh [DIR]   (default runs/lra_spt). Rerunning the same
# command skips finished runs and resumes interrupted ones (each sweep does).
set -euo pipefail
if [[ $# -gt 1 || "${1:-}" == -* ]]; then
    echo "usage: bash benchmarks/lra_spt/sweep.sh [DIR]   (default runs/lra_spt; 32 runs)" >&2
    exit 2
fi
DIR=${1:-runs/lra_spt}
METHODS=softmax,nystrom,spectral_shift,performer
COMMON=(--attention "$METHODS" --seeds 0 1 --config.train.steps=2000)
SPT=(--config.train.pretrain_steps=2000)
ROPE=(--config.model.positional=rope)

spectral-jax sweep --config lra/listops:quick "${COMMON[@]}" --workdir "$DIR/scratch"
spectral-jax sweep --config lra/listops:quick,spt "${COMMON[@]}" "${SPT[@]}" \
    --workdir "$DIR/spt"
spectral-jax sweep --config lra/listops:quick "${COMMON[@]}" "${ROPE[@]}" --workdir "$DIR/rope"
spectral-jax sweep --config lra/listops:quick,spt "${COMMON[@]}" "${SPT[@]}" "${ROPE[@]}" \
    --workdir "$DIR/rope_spt"
# One table per variant (a row's label names the preset and the fields that differ from it),
# then every variant side by side, each seed's figure in brackets.
for variant in scratch spt rope rope_spt; do
    echo "### $variant"
    spectral-jax table "$DIR/$variant" --format readme --json "$DIR/$variant/table.json"
done
echo "### all variants"
python "$(dirname "$0")/table.py" "$DIR"
