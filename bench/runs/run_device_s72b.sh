#!/bin/bash
# Session 72: the fold's flag on the GPU term by term (diag_fold2.py) and under each formulation (diag_fold3.py);
# the first that agrees with the reference becomes this copy's default for the fold / FP8 GPU tests and the FP8
# scores timed end to end (fold + FP8 launch + the guarded bf16 launch), with the sampled top-k from 4K entries.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -c "import sys; sys.path.insert(0, 'bench'); import bench_gemm_moe as b; print('ceilings', b.ceilings())"
timeout 60 python3 bench/runs/diag_fold2.py 2>&1 | tail -12
timeout 90 python3 bench/runs/diag_fold3.py 2>&1 | tail -6 | tee $OUT/fold3.txt
read BB PR < <(grep PICK $OUT/fold3.txt | awk '{print $2, $3}')
if [ "$BB" = True ] || [ "$BB" = False ]; then
  sed -i "s/^FOLD_BY_BITS = False/FOLD_BY_BITS = $BB/; s/^FOLD_PER_ROW = False/FOLD_PER_ROW = $PR/" dsv4/kernels/indexer_fp8.py
  grep -E "^FOLD_(BY_BITS|PER_ROW)" dsv4/kernels/indexer_fp8.py | tr '\n' ' '; echo
  run 150 tests/gpu/test_indexer_scores.py -k "fold or fp8"
  prefixes="24576"
  for prefix in 57344 122880 253952; do
    timeout 100 python3 bench/flags.py dsv4.kernels.topk.SAMPLED_MIN_N=4096 -- bench/sweep_index_scores.py --fp4 \
      --sampled --prefix $prefix --shapes 2>&1 | grep -E "keys|default \||gluon|fp8|top-|SAMPLED"
  done
else
  prefixes="24576 57344 122880 253952"
fi
# the sampled top-k (with SAMPLED_MIN_N lowered) where the FP8 sweeps above did not time it
for prefix in $prefixes; do
  timeout 100 python3 bench/flags.py dsv4.kernels.topk.SAMPLED_MIN_N=4096 -- bench/sweep_index_scores.py --sampled \
    --prefix $prefix --shapes 2>&1 | grep -E "top-|SAMPLED|^default \|"
done
