#!/bin/bash
# Prepared in session 26, one H200: why the prefill MoE's Gluon GEMMs run at ≈ 55 % of the measured bf16 peak.
# Session 26 ruled out the FP4 widening (256-token tiles, one widening per 256 tokens instead of 128: the GLU took
# the same 5.2 ms at M = 8192). The next suspect is L2 -> SM traffic: each 128-token tile re-reads its 1 MB of bf16
# activations for each of the GLU's 32 column tiles (≈ 16 GB per 8K-token layer against ≈ 4 GB of weights).
# Nsight Compute on the two GEMMs (and requant) at 8K tokens: tensor pipe, L2 and L1 throughput and bytes, stalls.
source bench/runs/lib.sh
METRICS=(gpu__time_duration.sum sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  lts__throughput.avg.pct_of_peak_sustained_elapsed l1tex__throughput.avg.pct_of_peak_sustained_active lts__t_bytes.sum
  dram__bytes_read.sum l1tex__m_xbar2l1tex_read_bytes.sum smsp__issue_active.avg.pct_of_peak_sustained_active
  sm__warps_active.avg.pct_of_peak_sustained_active launch__registers_per_thread launch__grid_size
  smsp__inst_executed_pipe_lsu.sum smsp__inst_executed.sum)
M=$(IFS=,; echo "${METRICS[*]}")
timeout 300 ncu --csv -k regex:"_wide_async|_requant" \
  --metrics "$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 bench/ncu_kernels.py --only prefill > $OUT/ncu_moe.csv 2> $OUT/ncu_moe.err
tail -3 $OUT/ncu_moe.err
python3 - <<'PY'
import csv, collections, os
rows = list(csv.reader(l for l in open(os.environ.get("OUT", "/tmp/outs") + "/ncu_moe.csv") if l.startswith('"')))
head, body = rows[0], rows[1:]
k, n, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
per = collections.defaultdict(dict)
for r in body:
    per[(r[head.index("ID")], r[k][:40])][r[n]] = r[v]
for (i, name), m in per.items():
    stalls = sorted(((float(x.replace(",", "")), s.split("stalled_")[1].split("_per")[0]) for s, x in m.items()
                     if "stalled_" in s), reverse=True)[:4]
    keep = {s: x for s, x in m.items() if "stalled_" not in s}
    print(i, name, keep, "stalls:", stalls)
PY
# The same question by launch shape: two warpgroups per CTA (128 weight rows of gate and of up, one activation tile
# for both: half the activation bytes per MMA) in register and shared-memory mode, against the one-warpgroup default
timeout 90 python3 bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,4 128,8,reg,4 128,8,reg,3 128,8,smem,4 \
  2>&1 | tail -5
