#!/usr/bin/env bash
# The prepared GPU check (about 8 minutes on one GPU): speed of every attention method at
# n = 1k-64k in bfloat16 and float32 next to jax.nn.dot_product_attention (XLA and cuDNN),
# a 2-minute ListOps training run at n = 2000, device and versions; JSON files in OUT.
#
#   bash benchmarks/gpu_check.sh OUT            # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh OUT --smoke    # tiny sizes on a CPU, under a minute (a test)
#
# Needs the package installed with a CUDA jaxlib (pip install -e '.[dev]' "jax[cuda12]").
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash benchmarks/gpu_check.sh OUT [--smoke] [--time-budget SECONDS]" >&2
    exit 2
fi
out="$1"
shift
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m spectral_jax.lra.bench.gpu_check --out "$out" "$@"
