#!/bin/bash
# Session 9, last call: #5's MoE table at prefill sizes on the final default (wide kernel, f16 widening) with the
# ceilings of the same run (copy bandwidth, bf16 / FP8 tensorwise / FP8 blockwise peaks).
export PYTHONUNBUFFERED=1
timeout 200 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1024,4096,8192 --no-sweep 2>&1 | grep -v -i warn | tail -30
