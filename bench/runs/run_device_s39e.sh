#!/bin/bash
# Session 39: PREFETCH_IDX in the model -- the ceilings of this run, the 8-layer 8K prefill off / on / off / on, and
# the 4-layer 8K profile's attention and top kernels off / on.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
F=dsv4.kernels.prefill_attention_gluon.PREFETCH_IDX
prefill_ab 100 $F
ktable 120 $F "_attn_kernel"
