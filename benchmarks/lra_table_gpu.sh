#!/usr/bin/env bash
# The LRA table on an accelerator: every task whose data this script generates (ListOps and
# Pathfinder, with LRA's algorithms) or is given (TEXT_DATA, RETRIEVAL_DATA, IMAGE_DATA,
# PATHX_DATA: the folder each task's `data.dir` names, `spectral-jax data info`), each at its
# published protocol (`protocol=lra`), seed 0, for
#   - softmax with rotary positions: the reference (Amos et al. 2024's from-scratch baseline),
#   - nystrom and spectral_shift,
#   - gated_deltanet: the best new method on recall (benchmarks/mqar_sweep_cpu: 99.5% at
#     width 64, where softmax has 24.6%),
# then one table (OUT/table.md, .json, and the accuracy-vs-throughput plot).
#
#   bash benchmarks/lra_table_gpu.sh OUT                    # on the accelerator: hours a task
#   RETRIEVAL_DATA=/data/lra_release/tsv_data bash benchmarks/lra_table_gpu.sh OUT  # and more
#   bash benchmarks/lra_table_gpu.sh OUT --smoke            # tiny data and runs on a CPU (a test)
#
# Resumable: the same command skips finished runs and resumes interrupted ones from their
# checkpoints (`spectral-jax sweep`), so a table can grow over several lent sessions. Needs
# the package installed with the `lra` extra and a jaxlib for the device.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 || "$1" == -* ]]; then
    echo "usage: bash benchmarks/lra_table_gpu.sh OUT [--smoke]" >&2
    exit 2
fi
out="$(mkdir -p "$1" && cd "$1" && pwd)"
smoke="${2:-}"
if [[ -n "$smoke" && "$smoke" != "--smoke" ]]; then
    echo "lra_table_gpu.sh: unknown option $smoke (allowed: --smoke)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
cli=("${PYTHON:-python}" -m spectral_jax.lra.cli)
methods="nystrom,spectral_shift,gated_deltanet"
data="$out/data"

if [[ -z "$smoke" ]]; then
    protocol=lra
    extra=()
    listops_sizes=()  # LRA's: 96,000 / 2,000 / 2,000 sequences of 500-2,000 tokens
    pathfinder_images=200000
else
    protocol=quick
    extra=(--config.train.steps=2 --config.train.eval_every=2 --config.train.eval_steps=1
           --config.train.log_every=1 --config.train.batch_size=4 --config.model.num_layers=1)
    listops_sizes=(--train 32 --val 8 --test 8 --min-length 20 --max-length 64)
    pathfinder_images=40
fi

tasks=()
if [[ ! -f "$data/listops/basic_test.tsv" ]]; then
    "${cli[@]}" data listops --out "$data/listops" "${listops_sizes[@]}"
fi
tasks+=("listops:$data/listops")
if [[ ! -d "$data/pathfinder32" ]]; then
    "${cli[@]}" data pathfinder --out "$data" --num-images "$pathfinder_images"
fi
tasks+=("pathfinder:$data")
# The tasks whose data cannot be generated, where given.
[[ -n "${TEXT_DATA:-}" ]] && tasks+=("text:$TEXT_DATA")
[[ -n "${RETRIEVAL_DATA:-}" ]] && tasks+=("retrieval:$RETRIEVAL_DATA")
[[ -n "${IMAGE_DATA:-}" ]] && tasks+=("image:$IMAGE_DATA")
[[ -n "${PATHX_DATA:-}" ]] && tasks+=("pathx:$PATHX_DATA")

run() {  # run TASK DATA_DIR SWEEP_DIR METHODS [overrides...]
    local task="$1" dir="$2" sweep="$3" names="$4"
    shift 4
    "${cli[@]}" sweep --config "lra/$task:protocol=$protocol" --attention "$names" \
        --workdir "$sweep" "--config.data.dir=$dir" "${extra[@]}" "$@"
}

sweeps=()
for entry in "${tasks[@]}"; do
    task="${entry%%:*}"
    dir="${entry#*:}"
    run "$task" "$dir" "$out/$task" "$methods"
    run "$task" "$dir" "$out/$task-rope" softmax --config.model.positional=rope
    sweeps+=("$out/$task" "$out/$task-rope")
done

"${cli[@]}" table "${sweeps[@]}" --json "$out/table.json" --plot "$out/accuracy_vs_throughput.png" \
    > "$out/table.md"
cat "$out/table.md"
