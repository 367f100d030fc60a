#!/bin/bash
# Prepared in session 59 for the next session with a device (≈ 5 min with the start): the shared graph pool
# (`dsv4.model.graphs.SHARED_POOL`, opt-in) -- its token test, then the memory the decode graphs hold with a pool each
# and with one shared (8 layers, row buckets up to 32), then the 8-layer B = 1 / 8 engine step with it on
# (graph replay beside it: the pool must not cost time). Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider \
  "tests/gpu/test_engine_gpu.py::test_shared_graph_pool_gives_the_same_tokens" 2>&1 | tail -4
for shared in False True; do
  timeout 150 python3 bench/flags.py dsv4.model.graphs.SHARED_POOL=$shared -- bench/bench_graph_memory.py --layers 8 \
    --max-batch 32 --prompt 256 2>&1 | grep -E "^[0-9]+ \||reserved"
done
timeout 150 python3 bench/flags.py dsv4.model.graphs.SHARED_POOL=True -- bench/bench_engine_step.py --layers 8 \
  --batches 1,8 --overlap on --steps 32 --top 0 2>&1 | grep -E "ceilings|^[0-9]+ \|"
