#!/bin/bash
# Session 13, last call: the model's GPU tests on the final tree; 8 Flash layers, decode at B = 8 / 64 (ctx 4096,
# CUDA graphs) with session 12's decode-size linear launch shapes patched in vs this session's. (s13c meant to
# do this A/B but patched the function `dsv4.kernels.fp8_linear` -- the package re-exports it under the
# module's name -- so both of its rows ran the new shapes.)
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 170 tests/gpu/test_model_gpu.py
B="bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 8,64 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs"
echo "== session 12 linear launch shapes"
timeout 90 python3 - $B <<'PY' 2>&1 | grep -E "patched|B=|Error"
import importlib, runpy, sys
f = importlib.import_module("dsv4.kernels.fp8_linear")
def old(m, n, k, groups=1):
    if m <= 16:
        return f.LinearConfig(bm=16, bn=64, swap_ab=True, fuse_quant=True, split_k=0)
    if m <= 1024:
        return f.LinearConfig(bm=64, bn=128, swap_ab=False, fuse_quant=False)
    return f.LinearConfig(bm=128, bn=128, swap_ab=False, fuse_quant=False, num_warps=8)
f.pick_linear_config = old
print("patched:", f.pick_linear_config(64, 4096, 8192))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
echo "== session 13 (default)"
timeout 90 python3 $B 2>&1 | grep -E "ceilings|B=|Error"
