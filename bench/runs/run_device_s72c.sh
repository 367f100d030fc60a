#!/bin/bash
# Session 72 (prepared; could not start): the fold's flag under each formulation (diag_fold3.py); the first that
# agrees with the reference becomes this copy's default (none: the fold in torch ops, FOLD_TORCH, and each term of the
# kernel's flag printed) for the fold / FP8 GPU tests and the FP8 scores timed end to end after 248K tokens (fold +
# FP8 launch + the guarded bf16 launch; with the sampled top-k); the ceilings; the sampled top-k at 16K entries.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 bench/runs/diag_fold3.py 2>&1 | tail -6 | tee $OUT/fold3.txt
read BB PR < <(grep PICK $OUT/fold3.txt | awk '{print $2, $3}')
if [ "$BB" = True ] || [ "$BB" = False ]; then
  sed -i "s/^FOLD_BY_BITS = False/FOLD_BY_BITS = $BB/; s/^FOLD_PER_ROW = False/FOLD_PER_ROW = $PR/" dsv4/kernels/indexer_fp8.py
else
  timeout 40 python3 bench/runs/diag_fold2.py 2>&1 | tail -8
  sed -i "s/^FOLD_TORCH = False/FOLD_TORCH = True/" dsv4/kernels/indexer_fp8.py
fi
grep -E "^FOLD_(BY_BITS|PER_ROW|TORCH)" dsv4/kernels/indexer_fp8.py | tr '\n' ' '; echo
runpar 100 4 tests/gpu/test_indexer_scores.py -k "fold or fp8"
timeout 60 python3 bench/flags.py dsv4.kernels.topk.SAMPLED_MIN_N=4096 -- bench/sweep_index_scores.py --fp4 \
  --sampled --prefix 253952 --shapes 2>&1 | grep -E "keys|default \||gluon|fp8|top-|SAMPLED"
timeout 40 python3 -c "import sys; sys.path.insert(0, 'bench'); import bench_gemm_moe as b; print('ceilings', b.ceilings())"
timeout 45 python3 bench/flags.py dsv4.kernels.topk.SAMPLED_MIN_N=4096 -- bench/sweep_index_scores.py --sampled \
  --prefix 57344 --shapes 2>&1 | grep -E "top-|SAMPLED|^default \|"
