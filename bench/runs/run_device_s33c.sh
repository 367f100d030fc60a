#!/bin/bash
# Prepared in session 32 for session 33, one H200 (≈ 5 min). moe_gemv.SCALE_WORDS (off until measured): the decode
# ("mma") MoE GEMVs read each row's E8M0 scale bytes of a K step as 32-bit words instead of one byte load per
# accumulator element. Offline sm_90a SASS: GLU 154 -> 96 registers, loop 737 -> 672 instructions, 16 LDG.E.U8 ->
# 8 LDG.E per step; down 93 -> 64 registers, loop 428 -> 379. (1) GPU tests: the words against the bytes bit for
# bit (interpreter-tested), the mma GEMV file. (2) The MoE call at decode sizes, bytes / words / bytes / words
# (the bench checks bit-identity too). (3) 8-layer decode rows, B = 1 and 8, off then on.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 200 tests/gpu/test_moe_gemv_words.py tests/gpu/test_moe_gemv_mma.py
G=dsv4.kernels.moe_gemv.SCALE_WORDS
timeout 120 python3 bench/bench_moe_flags.py --ms 1,8,64 "bytes:" "words:$G=True" "bytes2:" "words2:$G=True" 2>&1 \
  | tail -4
rows8 150 1,8 "$G=False"
rows8 150 1,8 "$G=True"
