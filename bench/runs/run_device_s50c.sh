#!/bin/bash
# Prepared in session 49 for session 50 (≈ 5 min): two launches fewer per layer in the paged decode step, both
# tested on the CPU through the interpreter and compiled offline for sm_90a, never run on a GPU:
#   attention.FUSED_KV_STORE          the window kv stored by the q latent + kv norm launch (norm_rope_two(store_b=))
#   attention.DECODE_Q_NORM_IN_KERNEL sliding / HCA layers' q heads' norm + RoPE in the decode attention kernel
# Their tests first (kernel level and the embedded model off / on), then 8 Flash layers' rows: off, both on, each
# alone, alternating. Adopt what passes and does not lose at B = 1 (then run the model-level files with it on).
source bench/runs/lib.sh
A=dsv4.model.attention
gate 300 tests/gpu/test_decode_step_fusions.py tests/gpu/test_cache_store.py tests/gpu/test_norm_rope.py \
  tests/gpu/test_attention.py || exit 1
BOTH="$A.FUSED_KV_STORE=True $A.DECODE_Q_NORM_IN_KERNEL=True"
for f in "$A.FUSED_KV_STORE=False" "$BOTH" "$A.FUSED_KV_STORE=True" "$A.DECODE_Q_NORM_IN_KERNEL=True" \
  "$A.FUSED_KV_STORE=False" "$BOTH"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
