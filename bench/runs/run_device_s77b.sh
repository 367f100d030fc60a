#!/bin/bash
# Session 77: the whole of tests/gpu (last whole run: session 45, 1,260 passed / 5 skipped in 394 s on 6 workers),
# over 12 pytest-xdist workers (whole files per worker); failures listed by runpar.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
runpar ${1:-560} 12 tests/gpu
grep -E "^FAILED|^ERROR" $OUT/pytest_par_${1:-560}.txt | head -40
