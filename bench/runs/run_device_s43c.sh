#!/bin/bash
# Session 43 (≈ 7 min): the packed router top-k and project_decode's early positions, now the default (GPU tests);
# two more decode load-order changes, off, bit-identical in the interpreter -- norm_rope.ROPE_FIRST (cos / sin
# loaded with the rows, before the norm's barriers) and cache_store.COPY_LOADS_FIRST (the decode pool's copies of
# this step's compressor rows: every load, then the stores). Their GPU tests; the norm / RoPE launches in CUDA graphs
# (bench_glue --norm); one eager B = 1 step's kernel table (4 layers) off / on; the 8-layer B = 1 rows off / on.
source bench/runs/lib.sh
run 250 tests/gpu/test_router.py tests/gpu/test_projections.py tests/gpu/test_norm_rope.py tests/gpu/test_cache_store.py
timeout 90 python3 bench/bench_glue.py --norm --tokens 1,8 2>&1 | grep -vE "Warning|warn" | tail -5
ON="dsv4.kernels.norm_rope.ROPE_FIRST=True dsv4.kernels.cache_store.COPY_LOADS_FIRST=True"
for flags in "" "$ON"; do
  echo "== profile_step ${flags:-default}"
  timeout 120 python3 bench/flags.py $flags -- bench/profile_step.py --layers 4 --batch 1 --ctx 4096 2>&1 \
    | grep -E "kernels, |_pool_kernel|_norm_rope|_gate_route|_decode_kernel"
done
rows8 150 1
rows8 150 1 $ON
