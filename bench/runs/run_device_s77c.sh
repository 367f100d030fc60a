#!/bin/bash
# Session 77: which parts launch the first 8K chunk's torch elementwise kernels (s75c: 332 µs in 5 launches of
# elementwise_kernel<128, 4> per 4 layers): profile_step --order now names the aten op of each launch.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 --order 2>&1 | grep -v -i warn \
  | grep -E "^-- |order:|elementwise_kernel|index_elementwise|vectorized_elem" | head -60
