#!/bin/bash
# Prepared in session 29 for session 30, one H200 (≈ 2 min): is an eager 8K / 2K forward of 4 Flash layers bound by
# the host or by the GPU, and where? (s29e: the inverse RoPE fused into the prefill attention took 1.43 ms of GPU
# time off an 8K forward of 4 layers, 52.6 -> 51.1 ms, but its wall time stayed at 55.4 ms; no host syncs in it,
# s29f). Per kernel the host's lead (GPU start minus launch end) and the GPU idle before kernels that waited.
source bench/runs/lib.sh
for N in 8192 2048; do
  timeout 120 python3 bench/profile_step.py --layers 4 --prefill $N --timeline 2>&1 | grep -vE "Warn|warn" | tail -16
done
