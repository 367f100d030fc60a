#!/bin/bash
# Session 34, one H200 (≈ 6 min): the new Gluon prefill attention (prefill_attention.GLUON, opt-in) -- its GPU tests,
# the Flash-shaped attention per layer kind at 8K against the Triton kernel (interleaved, max abs diff to the first
# column), then the 8-layer 8K prefill with GLUON off / on / off / on.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 240 tests/gpu/test_prefill_attention_gluon.py
grep -E "^E |Error|error" $OUT/pytest_240.txt | head -20
timeout 150 python3 bench/bench_prefill_glue.py --skip select queries --shapes 512,64,8,2 gluon 512,64,8,2 gluon 2>&1 \
  | tail -5
F=dsv4.kernels.prefill_attention.GLUON
for V in False True False True; do echo "GLUON=$V"; prefill8 120 "$F=$V"; done
