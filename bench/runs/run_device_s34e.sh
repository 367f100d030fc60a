#!/bin/bash
# Session 34, one H200 (≈ 6 min), after s34d: the Gluon prefill attention's EARLY_LOADS loop (each slot refilled
# as soon as its P.V completes, before waiting for the next tile: two tiles' copies in flight; s34d's Nsight put
# barrier and long-scoreboard stalls first). GPU tests of both loops, per layer kind at 8K interleaved, the 8-layer
# 8K prefill. Since s34d both loops keep the running sums per warpgroup (one cross-warpgroup reduction per tile
# fewer; summed at the end). After this run EARLY_LOADS became the kernel's only loop; the flag went away.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 200 tests/gpu/test_prefill_attention_gluon.py
grep -E "^E |Error|error" $OUT/pytest_200.txt | head -10
G=dsv4.kernels.prefill_attention_gluon.EARLY_LOADS
for V in False True False True; do
  echo "EARLY_LOADS=$V"
  timeout 100 python3 bench/flags.py "$G=$V" -- bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 \
    | tail -3
done
for V in False True; do echo "EARLY_LOADS=$V"; prefill8 100 "$G=$V"; done
# the model's prefill tests with EARLY_LOADS on (pytest run under bench/flags.py), in case the figures adopt it
P=$(python3 -c "import os, pytest; print(os.path.join(os.path.dirname(pytest.__file__), '__main__.py'))")
timeout 180 python3 bench/flags.py "$G=True" -- $P -q -p no:cacheprovider tests/gpu/test_model_gpu.py \
  -k "logits_match or greedy or prefill" 2>&1 | tail -2
