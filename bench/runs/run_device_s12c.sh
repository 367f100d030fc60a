#!/bin/bash
# Session 12: the cuBLAS linear test with padded rows; where an 8K prefill and a B = 1 decode step go now
# (profile_step.py, 4 Flash layers SWA/SWA/CSA/HCA; kernel tables saved under $OUT).
source bench/runs/lib.sh
run 100 tests/gpu/test_fp8_linear.py -k "cublas or counters or default_config"
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 > $OUT/prof_prefill.txt 2>&1; tail -45 $OUT/prof_prefill.txt
timeout 120 python3 bench/profile_step.py --layers 4 --order > $OUT/prof_decode.txt 2>&1; tail -30 $OUT/prof_decode.txt
