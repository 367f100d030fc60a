#!/bin/bash
# Session 49: test_fused_prefill_reads_are_bit_identical failed on one machine (in the 6-process suite, then 4 of 4
# alone right after) and passed on two fresh ones. A race that shows under GPU contention? The tiny model's decode
# logits, run after run in one process (bench/runs/diag_fused_reads.py), while another process keeps the GPU busy;
# then with PDL off and with the persistent GLU / down off, to bisect if it shows.
export PYTHONPATH=$PWD
G=dsv4.kernels.moe_glu_decode
python3 - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(__import__("os").environ.get("LOAD_S", "170"))
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
PY
LOAD=$!
sleep 5
echo "== default, GPU busy"; python3 bench/runs/diag_fused_reads.py FF TT FF TT FF 2>&1 | tail -5
echo "== DSV4_PDL=0, GPU busy"; DSV4_PDL=0 python3 bench/runs/diag_fused_reads.py FF TT FF TT 2>&1 | tail -4
echo "== persistent GLU/down off, GPU busy"
python3 bench/flags.py $G.ENABLED=False $G.DOWN_ENABLED=False -- bench/runs/diag_fused_reads.py FF TT FF TT 2>&1 | tail -4
kill $LOAD 2>/dev/null; wait
echo "== default, GPU idle"; python3 bench/runs/diag_fused_reads.py FF TT FF 2>&1 | tail -3
