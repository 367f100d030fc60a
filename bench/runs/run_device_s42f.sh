#!/bin/bash
# Session 42 (≈ 4 min): s42e's change kept for the split finish and the Sinkhorn programs, the row finish's
# collapse back in its old order (pre first, 80 registers): mHC GPU tests, the 8K forward's mHC kernels.
source bench/runs/lib.sh
run 130 tests/gpu/test_mhc.py
ktab 150 "_finish_kernel|_mix_kernel"
