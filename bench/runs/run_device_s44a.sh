#!/bin/bash
# Prepared in session 43 for session 44 (≈ 6 min): s43d's cut run of tests/gpu/test_model_gpu.py showed 8 passed and
# one failure, `test_cuda_graph_decode_matches_eager[1]` (graphs vs eager at B = 1, bit for bit), with no traceback
# (the call's time ran out). That test had not been run since about session 30, so the failure may be older than
# session 43. First its traceback under the defaults, then with each session-43 switch that can be turned off
# (the one-token rows mix's early fn loads, the split finish's one-step norm, the early cos / sin): a pass with one of
# them off names the change. The other session-43 changes (packed router top-k, early positions in project_decode,
# the decode pool's copies) have no switch: if all runs fail, compare with the session-42 tree (`git archive 0365445
# dsv4 | tar -x -C /tmp/s42` here, carry it, and run the test with PYTHONPATH pointing at it).
source bench/runs/lib.sh
PYT=$(python3 -c "import os, pytest; print(os.path.join(os.path.dirname(pytest.__file__), '__main__.py'))")
T="tests/gpu/test_model_gpu.py::test_cuda_graph_decode_matches_eager"
M=dsv4.kernels
for flags in "" "$M.mhc.ROWS_FN_EARLY=False" "$M.mhc.NORM_ONE_MAX=0" "$M.norm_rope.ROPE_FIRST=False" \
             "$M.mhc.ROWS_FN_EARLY=False $M.mhc.NORM_ONE_MAX=0 $M.norm_rope.ROPE_FIRST=False"; do
  echo "== ${flags:-default}"
  timeout 120 python3 bench/flags.py $flags -- $PYT -q -x --tb=short -p no:cacheprovider "$T" 2>&1 \
    | grep -E "passed|failed|Error|assert|^E " | head -8
done
run 200 tests/gpu/test_model_gpu.py --deselect "$T"
