#!/bin/bash
# Prepared in session 25, one H200: Pro's B = 64 row (s25e's 90 s limit cut it before any output: first compiles
# of Pro's B = 64 kernels, or a hang; the time limits tell which), then the whole 4-layer Pro table once more.
source bench/runs/lib.sh
echo "Pro, B = 64 at 4K"; pro 240 64 4096 0
echo "Pro, B = 1 / 8 / 64 at 4K, prefill 8K"; pro 240 1,8,64 4096 8192
