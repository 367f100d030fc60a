#!/bin/bash
# Session 44 (≈ 8 min): s43d's cut run of tests/gpu/test_model_gpu.py showed 8 passed and one failure,
# `test_cuda_graph_decode_matches_eager[1]` (graphs vs eager at B = 1, bit for bit), with no traceback. First its
# traceback under the defaults, then with each session-43 switch off (the one-token rows mix's early fn loads, the
# split finish's one-step norm, the early cos / sin), then the same test on the trees of sessions 42, 38, 34 and 30
# (carried under tmp/sNN: `git archive COMMIT dsv4 tests pyproject.toml`), then the rest of test_model_gpu.py.
source bench/runs/lib.sh
PYT=$(python3 -c "import os, pytest; print(os.path.join(os.path.dirname(pytest.__file__), '__main__.py'))")
T="tests/gpu/test_model_gpu.py::test_cuda_graph_decode_matches_eager"
M=dsv4.kernels
timeout 150 python3 -m pytest -q -x --tb=long -p no:cacheprovider "$T[1]" 2>&1 | grep -vE "^\s*$" | tail -60
for flags in "$M.mhc.ROWS_FN_EARLY=False" "$M.mhc.NORM_ONE_MAX=0" "$M.norm_rope.ROPE_FIRST=False" \
             "$M.mhc.ROWS_FN_EARLY=False $M.mhc.NORM_ONE_MAX=0 $M.norm_rope.ROPE_FIRST=False"; do
  echo "== ${flags:-default}"
  timeout 70 python3 bench/flags.py $flags -- $PYT -q -p no:cacheprovider "$T[1]" 2>&1 \
    | grep -E "passed|failed|^E " | head -6
done
for tree in s42 s38 s34 s30; do
  echo "== tree $tree"
  (cd tmp/$tree && timeout 70 python3 -m pytest -q -p no:cacheprovider "$T[1]" 2>&1 | grep -E "passed|failed|^E " | head -6)
done
run 200 tests/gpu/test_model_gpu.py --deselect "$T"
