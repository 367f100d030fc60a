#!/bin/bash
# Session 29, one H200 (≈ 4 min): s29e found the 8K forward of 4 Flash layers at 55.4 ms of wall time whether its
# GPU time was 52.6 or 51.1 ms. Where does the host wait for the GPU in it (CUDA sync debug mode), and how long is
# the host's own side of such a forward (cProfile over fresh 8K prompts, $OUT/cprofile_8192.txt)?
source bench/runs/lib.sh
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 --syncs 2>&1 | grep -vE "^ {4}[0-9 .]+  " | head -40
TOP=30 timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 --cprofile > $OUT/cprofile_8192.txt 2>&1
grep -E "function calls|wall" $OUT/cprofile_8192.txt
