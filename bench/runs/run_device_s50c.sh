#!/bin/bash
# Prepared in session 49 for session 50 (≈ 6 min): launches the paged decode step folds into others, each tested on
# the CPU through the interpreter (kernel level, and the embedded model off / on: bit-identical logits and cache rows,
# the counted launches fewer) and compiled offline for sm_90a, none run on a GPU yet:
#   attention.FUSED_KV_STORE          the window kv stored by the q latent + kv norm launch (norm_rope_two(store_b=))
#   attention.FUSED_ENTRY_STORE       the compressors' entries stored by the pooling launch's last arrivers
#   attention.DECODE_Q_NORM_IN_KERNEL sliding / HCA layers' q heads' norm + RoPE in the decode attention kernel
#   attention.COMPRESS_BESIDE         the compressors' step work on the side stream, after the projections
# (per Flash token: 43 + 62 + 22 launches fewer, 62-124 moved off the main stream). The side-stream move is the
# riskiest (streams do not exist in the interpreter): its GPU test runs eagerly and in graphs. Their tests first,
# then 8 Flash layers' rows: all off, all on,
# each alone, alternating. Adopt what passes and does not lose at B = 1 (then run the model-level files with it on).
source bench/runs/lib.sh
A=dsv4.model.attention
gate 400 tests/gpu/test_decode_step_fusions.py tests/gpu/test_cache_store.py tests/gpu/test_norm_rope.py \
  tests/gpu/test_attention.py "tests/gpu/test_model_gpu.py::test_compress_beside_on_the_side_stream_is_bit_identical" \
  || exit 1
ALL="$A.FUSED_KV_STORE=True $A.FUSED_ENTRY_STORE=True $A.DECODE_Q_NORM_IN_KERNEL=True"
ALL="$ALL $A.COMPRESS_BESIDE=True"
for f in "$A.FUSED_KV_STORE=False" "$ALL" "$A.FUSED_KV_STORE=True" "$A.FUSED_ENTRY_STORE=True" \
  "$A.DECODE_Q_NORM_IN_KERNEL=True" "$A.COMPRESS_BESIDE=True" "$A.FUSED_KV_STORE=False" "$ALL"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
