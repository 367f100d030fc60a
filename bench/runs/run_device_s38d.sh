#!/bin/bash
# Session 38, one H200 (≈ 5 min): the Gluon prefill attention's `PIPELINED` loop (tile i's QK issued before tile
# i - 1's P.V, so the softmax runs under the P.V; needs a 3-4 slot ring, so 32-key tiles). The 4-layer 8K kernel
# table for: the default (64-key tiles, 2 slots), 32-key tiles on 4 slots (plain loop), PIPELINED on 4 and on 3
# slots; then the 8-layer 8K prefill default / pipelined.
source bench/runs/lib.sh
G=dsv4.kernels.prefill_attention_gluon
ktab 120 _attn_kernel
ktab 120 _attn_kernel $G.BN=32 $G.STAGES=4
ktab 120 _attn_kernel $G.BN=32 $G.STAGES=4 $G.PIPELINED=True
ktab 120 _attn_kernel $G.BN=32 $G.STAGES=3 $G.PIPELINED=True
prefill8 100
prefill8 100 $G.BN=32 $G.STAGES=4 $G.PIPELINED=True
