#!/bin/bash
# Prepared in session 49 for session 50 (≈ 4 min): attention.FUSED_KV_STORE -- the paged decode step's window kv
# stored by the q latent + kv norm launch (`norm_rope_two(store_b=)`), one launch fewer per layer. Tested on the
# CPU through the interpreter (bit-identical logits and windows, one store_rows call fewer per layer and step;
# offline sm_90a compile: 32 registers). Never run on a GPU: its tests first, then 8 Flash layers' rows off / on,
# alternating. Adopt it if the tests pass and B = 1 does not lose (then also run the model-level files with it on).
source bench/runs/lib.sh
A=dsv4.model.attention
gate 200 tests/gpu/test_kv_store_fused.py tests/gpu/test_cache_store.py tests/gpu/test_norm_rope.py || exit 1
for f in False True False True; do
  echo "== FUSED_KV_STORE=$f"; rows8 100 1,2 "$A.FUSED_KV_STORE=$f" | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
