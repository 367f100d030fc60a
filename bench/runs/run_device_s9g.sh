#!/bin/bash
# Session 9, call 7: a second launch-shape sweep of the prefill attention at Flash's 8K shapes around the best of
# call 6 (512 dims per program, 32-key tiles, 8 warps, 2 stages), ms per call, L2 not flushed.
# (The call ran this as inline Python; it became bench/bench_prefill_glue.py after the call, the same code.)
export PYTHONUNBUFFERED=1
timeout 300 python3 bench/bench_prefill_glue.py --skip select --shapes 512,32,8,2 512,32,8,3 512,16,8,2 512,16,8,4 512,32,4,2 512,64,4,1
