#!/bin/bash
# Session 39: the defaults (PREFETCH_IDX, ONE_SCORER="lists") in the model: its logits against the CPU reference.
source bench/runs/lib.sh
run 230 tests/gpu/test_model_gpu.py -k logits_match
