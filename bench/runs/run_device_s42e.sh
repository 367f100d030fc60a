#!/bin/bash
# Session 42 (≈ 6 min): the mHC finishes with every load issued before the first use (a CTA barrier between the
# row's loads and the partials'): GPU tests, then the 4-layer 8K forward's mHC kernels new / old / new (the old
# kernels file, commit 680964b's dsv4/kernels/mhc_kernels.py, was carried as bench/runs/s42_old_mhc_kernels.py.txt
# and removed after the run: `git show 680964b:dsv4/kernels/mhc_kernels.py` to rerun), then the 8-layer decode
# rows at B = 1.
source bench/runs/lib.sh
run 200 tests/gpu/test_mhc.py tests/gpu/test_block_sites.py
cp dsv4/kernels/mhc_kernels.py /tmp/new_mhc.py
for v in new old new; do
  if [ $v = old ]; then cp bench/runs/s42_old_mhc_kernels.py.txt dsv4/kernels/mhc_kernels.py; else cp /tmp/new_mhc.py dsv4/kernels/mhc_kernels.py; fi
  echo "== $v"; ktab 150 "_finish_kernel|_mix_kernel"
done
rows8 150 1
