#!/bin/bash
# Session 10: is s10f's top-1 failure (fp4-tiny: 8 experts, top-2, 200 tokens = 50 pairs per expert, now on the
# 64-row wide kernel) a numerical difference of the wide kernel or the test's noise? (1) the MoE alone at those
# shapes, per-group vs wide against the fp32-output reference, 6 seeds; (2) the model test with the old
# threshold; (3) the rest of test_model_gpu on the new defaults.
source "$(dirname "$0")/lib.sh"
timeout 100 python3 - <<'PY'
import sys, torch
sys.path.insert(0, "tests/gpu")
from test_moe import _mxfp4_experts, _topk
from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref, MoEConfig
from dsv4.kernels.moe_config import large_batch_config
wide = MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, wide=True)
print("seed | rel err per-group | rel err wide64 | rel diff per-group vs wide")
for seed in range(6):
    gen = torch.Generator("cuda").manual_seed(seed)
    ex = _mxfp4_experts(8, 256, 128, gen)
    x = torch.randn(200, 256, generator=gen, device="cuda").to(torch.bfloat16)
    ids, w = _topk(200, 8, 2, gen)
    p = finalize_experts(ex)
    ref = fused_moe_ref(x, ids, w, ex, out_dtype=torch.float32).double()
    a = fused_moe(x, ids, w, p, config=large_batch_config(), out_dtype=torch.float32).double()
    b = fused_moe(x, ids, w, p, config=wide, out_dtype=torch.float32).double()
    r = lambda u, v: float((u - v).norm() / v.norm())
    print(f"{seed} | {r(a, ref):.2e} | {r(b, ref):.2e} | {r(a, b):.2e}")
PY
echo "--- fp4-tiny with the old threshold (64 pairs per expert for any wide tile)"
timeout 100 python3 - <<'PY' 2>&1 | grep -E "e2e|passed|failed|Error"
import sys, pytest
from dsv4.kernels import moe_config
moe_config.WIDE64_MIN_PAIRS_PER_EXPERT = 64
sys.exit(pytest.main(["-q", "-s", "--tb=line", "-p", "no:cacheprovider", "tests/gpu/test_model_gpu.py::test_logits_match_cpu_reference[fp4-tiny]"]))
PY
echo "--- the rest of test_model_gpu"
run 250 tests/gpu/test_model_gpu.py --deselect "tests/gpu/test_model_gpu.py::test_logits_match_cpu_reference[fp4-tiny]"
