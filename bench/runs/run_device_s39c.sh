#!/bin/bash
# Session 39: is the prefill attention bound by its key copies? The Gluon kernel at 8K per layer kind, then the
# same with prefill_attention_gluon.PROBE_NO_COPY (no key tile copied: wrong results, the compute chain's time
# alone). (Run at commit f21746c with `--shapes gluon seesaw` for the removed seesaw kernel.)
source bench/runs/lib.sh
for probe in False True; do
  echo "PROBE_NO_COPY=$probe"
  timeout 150 python3 bench/flags.py dsv4.kernels.prefill_attention_gluon.PROBE_NO_COPY=$probe -- \
    bench/bench_prefill_glue.py --skip select queries --shapes gluon 2>&1 | tail -4
done
