#!/bin/bash
# Session 83, one call (≈ 6 min): the one-token GEMM's K split in the model (linear_config.DECODE_MIN_KBLOCKS /
# DECODE_PROGRAMS; sessions 13 / 17 / 24 chose the rule from isolated sweeps). Session 80's time line had wo_b at
# ≈ 58 % of copy (17.2 µs exposed for 33.5 MB, 32 tiles x 8 splits of 8 K blocks) against wq_b's ≈ 73 % (256
# programs of 8 blocks, no split). 8 Flash layers' B = 1 rows: default / min 16 blocks (wo_b 4 splits of 16) /
# 4 x 132 programs (wo_b 16 splits of 4, wq_b 2 of 4), two rounds. Other split, other fp32 sum order: the outputs
# differ in rounding, not in meaning.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
L=dsv4.kernels.linear_config
rows8 150 1
rows8 100 1 $L.DECODE_MIN_KBLOCKS=16
rows8 100 1 $L.DECODE_PROGRAMS=528
rows8 100 1
rows8 100 1 $L.DECODE_MIN_KBLOCKS=16
rows8 100 1 $L.DECODE_PROGRAMS=528
