"""bench/bench_parallel.py (the full-size multi-GPU benchmark) on CPU with gloo and a tiny config:
the script's plumbing (ranks, random fill, prefill/decode/MTP/verify timing, roofline, JSON) keeps
working between device sessions; bench/bench_engine_step.py likewise (`--smoke`). Their numbers here mean
nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_bench_parallel_runs_on_two_cpu_ranks(tmp_path):
    from dsv4.checkpoint.writer import tiny_config

    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(tiny_config("fp4", "sliding,csa,hca").to_dict()))
    out = tmp_path / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_parallel.py"), "--device", "cpu",
                          "--config", str(cfg_path), "--world", "2", "--batches", "1,3", "--ctx", "20",
                          "--prefill", "40", "--prefill-chunks", "40,16", "--reps", "1", "--prefill-reps", "1",
                          "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["world"], result["tp"], result["ep"], result["layers"]) == (2, 2, 2, 3)
    assert [r["batch"] for r in result["decode"]] == [1, 3]
    for r in result["decode"]:
        assert r["decode_ms"] > 0 and r["mtp_ms"] > 0 and r["verify2_ms"] > 0 and r["roof_ms"] > 0
    assert result["prefill"]["tokens"] == 40
    assert [c["chunk"] for c in result["prefill_chunked"]] == [16] and result["prefill_chunked"][0]["ms"] > 0


def test_bench_engine_step_smoke():
    """The engine benchmark's plumbing: both overlap modes per batch size, the table and the profile listing."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_engine_step.py"), "--smoke", "--batches", "1,2",
                          "--prompt", "20", "--steps", "3", "--top", "4"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line[:1].isdigit() and " | " in line]
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "off", "1.00"), ("1", "on", "1.00"), ("2", "off", "1.00"),
                                                  ("2", "on", "1.00")]
    assert "where the profiled steps' host time goes" in run.stdout


def test_bench_engine_step_speculative_smoke():
    """With MTP drafts: both draft paths (device / host) at one batch size, and the engine-part timeline."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_engine_step.py"), "--smoke", "--batches", "2",
                          "--prompt", "20", "--steps", "3", "--top", "4", "--overlap", "on", "--speculative", "1",
                          "--drafts", "both", "--timeline"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line[:1].isdigit() and " | " in line]
    assert [(r[0], r[1]) for r in rows] == [("2", "on device"), ("2", "on host")]
    assert all(float(r[2]) >= 1.0 for r in rows)
    assert run.stdout.count("GPU idle") >= 2 and "speculator.verify" in run.stdout  # the timeline of each mode


def test_bench_graph_memory_smoke():
    """The graph-memory benchmark's plumbing: one row per row bucket up to --max-batch, every request decoded."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_graph_memory.py"), "--smoke", "--max-batch", "4",
                          "--prompt", "20"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line[:1].isdigit() and " | " in line]
    assert [r[0] for r in rows] == ["1", "2", "4"]


def test_bench_peer_transformers_smoke():
    """The transformers peer's plumbing (its config cut, cache-driven decode, prefill) at the tests' tiny width."""
    import pytest
    pytest.importorskip("transformers")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_peer_transformers.py"), "--tiny", "--layers", "3",
                          "--ctx", "40", "--batches", "1,2", "--prefill", "48", "--reps", "2"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "['sliding_attention', 'compressed_sparse_attention', 'heavily_compressed_attention']" in run.stdout
    decode = [line for line in run.stdout.splitlines() if line.startswith("peer decode")]
    assert [line.split()[2] for line in decode] == ["B=1", "B=2"]
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in decode)
    assert "peer prefill 48:" in run.stdout


def test_bench_prefill_graphs_smoke():
    """The prefill-pieces benchmark's plumbing (with the MTP block's catch-up): one row per prompt length, both
    modes timed, its bucket named."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_prefill_graphs.py"), "--smoke", "--prompts",
                          "5,40", "--reps", "1", "--mtp"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line[:1].isdigit() and " | " in line]
    assert [(r[0], r[4]) for r in rows] == [("5", "16"), ("40", "64")]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    # with decode rows beside the prompt (one forward against mixed_steps' split, or the split against the one
    # pass): the bucket holds them too
    for flags, modes in (([], "one forward ms | split ms"), (["--one-pass"], "split ms | one pass ms")):
        run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_prefill_graphs.py"), "--smoke", "--prompts",
                              "9", "--reps", "1", "--decode-rows", "12", "--ctx", "40", *flags], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        rows = [line.split(" | ") for line in run.stdout.splitlines() if line[:1].isdigit() and " | " in line]
        assert [(r[0], r[4]) for r in rows] == [("9", "32")] and modes in run.stdout


@pytest.mark.parametrize("flags", [[], ["--one-pass", "same-bucket"]])
def test_bench_arrivals_smoke(flags):
    """The arrivals benchmark's plumbing: both modes, their step times and the count of split steps (none on the
    CPU, where the model has no graphs and so never splits)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(REPO / "bench" / "bench_arrivals.py"), "--smoke", "--batch", "2",
                          "--prompt", "20", "--arrival", "12", "--every", "2", "--steps", "4", "--rounds", "1", *flags],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ("one pass |" if flags else "split |") in run.stdout
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith(("off |", "on |"))]
    assert [r[0] for r in rows] == ["off", "on"]
    for r in rows:
        assert float(r[1]) > 0 and float(r[2]) > 0 and float(r[3]) > 0
        assert r[4] == "0 / 2" and r[5] == "1"
