#!/bin/bash
# Session 10: s10e's one failure (test_logits_match_cpu_reference[fp4-tiny], message cut by the time limit):
# the test with the new defaults, then with the Gluon MoE off, then with the prefill attention's one load off.
source "$(dirname "$0")/lib.sh"
for v in "1 1" "0 1" "1 0"; do
echo "--- moe_wide.ASYNC / prefill_attention.KV_ONE_LOAD = $v"
V="$v" timeout 150 python3 - <<'PY' 2>&1 | grep -vE "^\s*$" | tail -25
import os, sys, pytest
from dsv4.kernels import moe_wide, prefill_attention
a, b = os.environ["V"].split()
moe_wide.ASYNC, prefill_attention.KV_ONE_LOAD = a == "1", b == "1"
sys.exit(pytest.main(["-q", "-x", "-s", "--tb=short", "-p", "no:cacheprovider",
                      "tests/gpu/test_model_gpu.py::test_logits_match_cpu_reference[fp4-tiny]"]))
PY
done
