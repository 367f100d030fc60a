#!/bin/bash
# Prepared in session 30 for session 31, one H200 (≈ 5 min), after s31b.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
# attention.PAIRED_NORMS (norm_rope_two: the q latent's and the window kv's norms in one launch; on CSA layers the q
# heads' and the indexer q's glue in another: one or two launches fewer per decode layer; prepared in session 30): its tests, then 8-layer decode rows off / on / off / on (graph replay); make it
# the default if the tests pass and the replay is not slower
run 120 tests/gpu/test_norm_rope.py tests/gpu/test_model_gpu.py -k "pair or paired"
A=dsv4.model.attention.PAIRED_NORMS
for V in False True False True; do echo "PAIRED_NORMS=$V"; rows8 100 1,8 $A=$V; done
