#!/bin/bash
# Session 4, third device call: prefill attention tests, where prefill waits for the GPU, and (dev aid,
# if present) which change moves the embedded model's greedy text.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=line tests/gpu/test_prefill_attention.py 2>&1 | tail -4
[ -f bench/diag_embedded.py ] && timeout 200 python3 bench/diag_embedded.py 2>&1 | grep -v Warn | tail -12
TOP=8 timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 --syncs 2>&1 | grep -v Warn | tail -40
