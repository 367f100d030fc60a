#!/bin/bash
# Session 10: test_logits_match_cpu_reference with its top-1 criterion on the reference's confident positions
# (pooled over prefill and decode, after s10h).
source "$(dirname "$0")/lib.sh"
timeout 200 python3 -m pytest -q -s --tb=short -p no:cacheprovider "tests/gpu/test_model_gpu.py::test_logits_match_cpu_reference" 2>&1 \
    | grep -E "e2e|passed|failed|Error|assert" | tail -30
