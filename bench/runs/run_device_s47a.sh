#!/bin/bash
# Prepared in session 46 for session 47 (part 1, ≈ 6 min; part 2 is run_device_s47b.sh). Session 46 spent its device time finding a race (the attention
# input's fused projection stack built inside the side-stream branch; fixed: built at finalize, a rebuild keeps the
# old weights until its stream read them) and could not run the fix's GPU tests to their summary line. First the
# rows of today's defaults (a quiet GPU, timings before tests), then: the rebuild test's sensitivity (record_stream
# off must make it fail), the new tests, and the model / MoE / graph tests around session 46's changes.
source bench/runs/lib.sh
rows8 150 1,8
# the opt-in branch "pair_q_latent" (a CSA layer's indexer.wq_b beside its wq_b; Flash's 8 layers hold 3 CSA layers)
P="dsv4.model.side_stream.OVERLAP=('shared_expert','projections','pair_q_latent')"
for rep in 1 2; do
  rows8 90 1,8 "$P"
  rows8 90 1,8
done
