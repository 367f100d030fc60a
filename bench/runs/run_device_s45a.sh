#!/bin/bash
# Prepared in session 44 for session 45 (≈ 9 min): the whole of tests/gpu (1,265 tests; last run whole in session 6;
# s44c ran ≈ 740 of them serially in 9 minutes, cut by its limits) over 6 xdist workers, then
# norm_rope.ROPE_FIRST_PREFILL (prepared in session 44: the early cos / sin at 8 rows per program too, expected
# bit-identical now that every rotation rounds its products): its bit-identity tests with it on.
source bench/runs/lib.sh
runpar 430 6 tests/gpu
PYT=$(python3 -c "import os, pytest; print(os.path.join(os.path.dirname(pytest.__file__), '__main__.py'))")
timeout 80 python3 bench/flags.py dsv4.kernels.norm_rope.ROPE_FIRST_PREFILL=True -- $PYT -q -p no:cacheprovider \
  tests/gpu/test_norm_rope.py -k "rope_first or rotation_alone" 2>&1 | grep -E "passed|failed|^E " | head -6
