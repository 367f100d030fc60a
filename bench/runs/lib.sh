# Shared by the run scripts (source it): unbuffered Python, $OUT, and `run LIMIT ARGS...` = pytest with a time
# limit that prints the summary line and any failures (a run cut by the limit keeps its output in $OUT).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
run() {
  timeout $1 python3 -m pytest -q -rf --tb=line -p no:cacheprovider "${@:2}" > $OUT/pytest_$1.txt 2>&1
  grep -E "passed|failed|FAILED|Error|error:" $OUT/pytest_$1.txt | grep -vE "^[.sF]+ *\[" | tail -14
}
# `runpar LIMIT WORKERS ARGS...`: as `run`, over WORKERS pytest-xdist processes (whole files per worker; the device
# image has pytest-xdist and pytest-timeout: one test stuck past 240 s fails alone). The GPU tests' time is mostly
# Triton compiling on the CPU, which the 16 cores share out.
runpar() {
  local per_test=""; python3 -c "import pytest_timeout" 2>/dev/null && per_test="--timeout 240"
  # its own session, killed whole at the end: a timed-out controller leaves its xdist workers running on the GPU
  # (session 45: they were still there during the timings that followed)
  setsid timeout $1 python3 -m pytest -q -rf --tb=line -p no:cacheprovider -n $2 --dist loadfile $per_test \
    "${@:3}" > $OUT/pytest_par_$1.txt 2>&1 &
  local sid=$!
  wait $sid
  pkill -9 -s $sid 2>/dev/null; sleep 1
  grep -E "passed|skipped in|failed|FAILED|Error|error:" $OUT/pytest_par_$1.txt | grep -vE "^[.sF]+ *\[" | tail -14
}
# `rows8 LIMIT BATCHES module.FLAG=value...`: 8 Flash layers on one GPU, decode rows at ctx 4096 (paged FP8, graphs)
# with the module flags set (bench/flags.py), the ceilings and B= lines only.
rows8() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522 timeout $1 \
    python3 bench/flags.py "${@:3}" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches $2 --ctx 4096 \
    --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -6
}
# `rows8_at LIMIT CTX BATCHES module.FLAG=value...`: rows8 at context CTX, the decode lines only.
rows8_at() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522 timeout $1 \
    python3 bench/flags.py "${@:4}" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches $3 --ctx $2 \
    --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=.*decode |rror|memory" | head -6
}
# `pro LIMIT BATCHES CTX PREFILL module.FLAG=value...`: the first 4 Pro layers (HCA, HCA, CSA, HCA; ≈ 70 GB) on
# one GPU, decode rows at ctx CTX (paged FP8, graphs) and a prefill of PREFILL tokens (0: none), with the flags set.
pro() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29528 timeout $1 \
    python3 bench/flags.py "${@:5}" -- bench/bench_parallel.py --config bench/configs/deepseek-v4-pro.config.json \
    --world 1 --layers 4 --reps 4 --batches $2 --ctx $3 --kv-dtype fp8 --prefill $4 --cuda-graphs 2>&1 \
    | grep -E "ceilings|B=.*decode |prefill|rror|memory" | head -8
}
# `prefill8 LIMIT module.FLAG=value...`: 8 Flash layers on one GPU, one 8K-token prefill (paged FP8, graphs) with the
# module flags set; the ceilings and prefill lines only.
prefill8() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout $1 \
    python3 bench/flags.py "${@:2}" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 \
    --kv-dtype fp8 --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|rror" | head -4
}
# Nsight metrics of a tensor-core kernel for `ncu_cmd`: time, tensor pipe, issue activity, stall reasons per issue
MMA_METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
MMA_METRICS="$MMA_METRICS,smsp__issue_active.avg.pct_of_peak_sustained_active"
MMA_METRICS="$MMA_METRICS,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
# `ncu_moe LIMIT COUNT METRICS`: Nsight Compute on the first COUNT prefill-MoE Gluon GEMMs of bench/ncu_kernels.py
# (8K tokens), one line per kernel: its metrics and its top stall reasons (when METRICS asks for them).
ncu_moe() {
  ncu_cmd $1 $2 "$3" bench/ncu_kernels.py --only prefill
}
# `ncu_cmd LIMIT COUNT METRICS SCRIPT ARGS...`: the same on the first COUNT Gluon MoE GEMMs that a Python script
# launches (e.g. bench/bench_moe_wide_shapes.py with one shape); KERNEL=regex for other kernels.
ncu_cmd() {
  timeout $1 ncu --csv -k regex:"${KERNEL:-_wide_async}" -c $2 --metrics "$3" python3 "${@:4}" \
    2>/dev/null | grep '^"' | python3 -c "
import csv, sys, collections
rows = list(csv.reader(sys.stdin)); h = rows[0]
per = collections.defaultdict(dict)
for r in rows[1:]:
    per[r[h.index('ID')]][r[h.index('Metric Name')]] = r[h.index('Metric Value')]
for i, m in per.items():
    st = sorted(((float(v.replace(',', '')), k.split('stalled_')[1].split('_per')[0]) for k, v in m.items()
                 if 'stalled_' in k), reverse=True)[:7]
    print(i, {k[:40]: v for k, v in m.items() if 'stalled_' not in k}, 'stalls', st)"
}
# `ncu_src LIMIT NAME SCRIPT ARGS...`: Nsight Compute's source counters (PC sampling) on the first launch of the
# kernels matching KERNEL (regex, default `_wide_async`) that SCRIPT runs: the report goes to $OUT/NAME.ncu-rep, and
# the 30 SASS instructions with the most stall samples are printed with their three largest stall columns.
ncu_src() {
  timeout $1 ncu -k regex:"${KERNEL:-_wide_async}" -c 1 --section SourceCounters --section WarpStateStats \
    -f -o $OUT/$2 python3 "${@:3}" > /dev/null 2>&1
  ncu --import $OUT/$2.ncu-rep --page source --csv --print-source sass 2>/dev/null | python3 bench/ncu_source_top.py
}
# `ktab LIMIT REGEX module.FLAG=value...`: 4 Flash layers, one 8K prefill (bench/profile_step.py) with the module
# flags set: the kernel count and GPU µs, and the lines of the kernels matching REGEX.
ktab() {
  timeout $1 python3 bench/flags.py "${@:3}" -- bench/profile_step.py --prefill 8192 2>&1 \
    | grep -E "kernels, |$2" | head -6
}
# `ktable LIMIT FLAG [REGEX]`: `ktab` with the module flag off, then on (REGEX default: attention and norm_rope).
ktable() {
  for on in False True; do ktab $1 "${3:-_attn_kernel|norm_rope}" $2=$on; done
}
# `prefill_ab LIMIT FLAG`: `prefill8` with the module flag off, on, off, on.
prefill_ab() {
  for on in False True False True; do prefill8 $1 $2=$on; done
}
# `gate LIMIT FILES...`: the kernel tests a run script's later steps depend on (pytest -s: their printed lines kept),
# the pass / fail lines shown; non-zero when anything failed or nothing passed (`gate ... || exit 1`: a faulting
# kernel would otherwise end the benches' CUDA context too).
gate() {
  timeout $1 python3 -m pytest -q -s -rf --tb=short -p no:cacheprovider "${@:2}" > $OUT/gate.txt 2>&1
  grep -E "bit-identical|passed|failed|Error|error" $OUT/gate.txt | head -24
  grep -qE "[0-9]+ passed" $OUT/gate.txt && ! grep -q FAILED $OUT/gate.txt
}
# `with_llguidance`: install the carried llguidance wheel (.whl/, carry [".whl"]) into /tmp/site and put it and the
# checkout on PYTHONPATH (the structured-output tests and bench_structured.py need it).
with_llguidance() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || echo "no llguidance wheel"
  export PYTHONPATH=$PWD:/tmp/site
}
