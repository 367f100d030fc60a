# Shared by the run scripts (source it): unbuffered Python, $OUT, and `run LIMIT ARGS...` = pytest with a time
# limit that prints the summary line and any failures (a run cut by the limit keeps its output in $OUT).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
run() {
  timeout $1 python3 -m pytest -q -rf --tb=line -p no:cacheprovider "${@:2}" > $OUT/pytest_$1.txt 2>&1
  grep -E "passed|failed|FAILED|Error|error:" $OUT/pytest_$1.txt | grep -vE "^[.sF]+ *\[" | tail -14
}
