#!/bin/bash
# Prepared in session 22 as s23a (not run: the device budget was spent), one H200: the three test_model_gpu tests not re-run
# after session 22 removed the mHC "fused" finish and the MoE launch fusions, then the greedy-drafts A/B at B = 8
# (s22e measured B = 1 only): 8 Flash layers, 1 draft, 3 alternating rounds.
source bench/runs/lib.sh
run 200 tests/gpu/test_model_gpu.py -k "llm_with_cuda_graphs or overlap or speculative"
timeout 300 python3 bench/bench_engine_step.py --layers 8 --batches 8 --prompt 2048 --steps 16 \
  --overlap on --speculative 1 --drafts both --repeat 3 > $OUT/spec_ab8.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/spec_ab8.txt
