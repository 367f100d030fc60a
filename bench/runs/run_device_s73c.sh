# Session 73: the FP8 scores and the sampled top-k at the first chunks' key counts (2K-4K keys)
source bench/runs/lib.sh
for p in 0 8192; do timeout 45 python3 bench/flags.py dsv4.kernels.topk.SAMPLED_MIN_N=1024 -- bench/sweep_index_scores.py \
  --fp4 --sampled --prefix $p --shapes 2>&1 | grep -E "keys|default \||gluon|fp8|top-|SAMPLED"; done
