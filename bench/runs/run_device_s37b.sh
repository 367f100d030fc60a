#!/bin/bash
# Session 37b, one H200: s37a's cut parts again -- `block.FUSE_BLOCK_SITES` GPU test alone, then the 8-layer decode
# rows (B = 1, 8) and the 8K prefill, on / off / on in the same call (the first run of s37a paid the compiles).
source bench/runs/lib.sh
run 300 tests/gpu/test_model_gpu.py tests/gpu/test_block_sites.py -k "block_sites"
F=dsv4.model.block.FUSE_BLOCK_SITES
rows8 150 1,8 $F=True
rows8 150 1,8
rows8 150 1,8 $F=True
prefill8 100
prefill8 100 $F=True
prefill8 100
