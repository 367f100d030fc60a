#!/bin/bash
# Session 13: 8 Flash layers, decode at B = 1 / 8 / 64 (ctx 4096, CUDA graphs), session 12's decode-size linear
# launch shapes vs this session's (the old `pick_linear_config` patched in); one eager B = 1 decode step's
# kernels in launch order (4 layers).
# (Its A/B is void: it patched `dsv4.kernels.fp8_linear`, which the package re-exports as the function, so both rows ran
# the new shapes; run_device_s13g.sh repeats the A/B with importlib.)
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
B="bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8,64 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs"
echo "== session 12 linear launch shapes"
timeout 150 python3 - $B <<'PY' 2>&1 | grep -E "ceilings|B=|Error"
import runpy, sys
import dsv4.kernels.fp8_linear as f
def old(m, n, k, groups=1):
    if m <= 16:
        return f.LinearConfig(bm=16, bn=64, swap_ab=True, fuse_quant=True, split_k=0)
    if m <= 1024:
        return f.LinearConfig(bm=64, bn=128, swap_ab=False, fuse_quant=False)
    return f.LinearConfig(bm=128, bn=128, swap_ab=False, fuse_quant=False, num_warps=8)
f.pick_linear_config = old
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
echo "== session 13 (default)"
timeout 150 python3 $B 2>&1 | grep -E "ceilings|B=|Error"
timeout 120 python3 bench/profile_step.py --layers 4 --order > $OUT/profile.txt 2>&1; tail -5 $OUT/profile.txt
