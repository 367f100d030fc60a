#!/bin/bash
# (The code it measured was reverted after this run: its flags are in commits cc95bb4 / c1d91f3.)
# Session 69: the top-k's passes with the next chunk's load issued first (topk.PREFETCH, a register double buffer)
# against without, over chunk lengths and warps, with and without the window from the top key; then its GPU tests.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 253952 57344; do
  for pf in True False; do
    echo "PREFETCH=$pf prefix $p"
    timeout 120 python3 bench/flags.py dsv4.kernels.topk.PREFETCH=$pf -- bench/sweep_index_scores.py --prefix $p --shapes \
      --topk --window 2>&1 | grep -v -i warn | grep -A11 "^top-" | tail -11
  done
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_topk.py 2>&1 | tail -3
