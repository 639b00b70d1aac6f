#!/usr/bin/env bash
# MQAR sweep: L=64, K=4, 100k training sequences, 3000 steps of 64; widths then methods.
cd /work/runs/mqar_sweep
. /work/main/.venv/bin/activate
for w in 64 32 128; do
for m in softmax gated_deltanet deltanet gla mamba2 retnet linear performer local memory_compressed gated_linear; do
  d=w${w}/$m
  [ -f $d/results.json ] && continue
  s=$(date +%s)
  spectral-jax train --config lm/mqar:attention=$m,width=$w \
    --config.data.options.num_train=100000 --config.train.steps=3000 \
    --config.train.eval_every=500 --workdir $d > $d.log 2>&1
  echo "$w $m rc=$? wall=$(( $(date +%s) - s ))" >> done.txt
done; done
