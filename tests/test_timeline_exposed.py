"""bench/timeline_exposed.py: profile_step's kernel table parsed, and each kernel's exposed time (the part of its span
after the latest earlier end) against a brute-force count on a grid."""
from __future__ import annotations

import random

from bench.timeline_exposed import Kernel, exposed, main, parse


def _table(kernels: list[Kernel], labels: list[Kernel]) -> list[str]:
    """The lines `profile_step.py --timeline --kernels` prints around its table, kernels and host labels mixed."""
    rows = sorted(kernels + labels, key=lambda k: k.start)
    return (["decode step: 1.6 ms on the host", "GPU kernels (µs from the first: start, span, stream, name):"]
            + [f"  {k.start:8.1f} {k.span:6.1f} s{k.stream}  {k.name}" for k in rows]
            + ["host (ms from the step's start):", "  +  0.018 .. +  0.037  HybridCache.reserve"])


def _random_kernels(rng: random.Random, n: int) -> list[Kernel]:
    """Spans on a 0.1 µs grid over a few streams, overlapping as PDL launches do, with idle gaps now and then."""
    out, t = [], 0.0
    for _ in range(n):
        t = round(t + rng.choice([0.0, 0.5, 1.3, 2.2, 6.0]) * rng.random(), 1)
        out.append(Kernel(t, round(0.1 + 20 * rng.random(), 1), rng.choice(["7", "142", "143"]),
                          rng.choice(["_fp8_gemv_kernel", "_mix_rows_kernel", "void at::native::elementwise_kernel<"
                                      "128, 4, at::native::gpu_kernel_impl<at::native::Binary"])))
    return out


def _brute(kernels: list[Kernel], start: float = float("-inf")) -> list[float]:
    """In end order: the 0.1 µs cells of each span that lie after `start` and every earlier-ending kernel's end."""
    order = sorted(kernels, key=lambda k: (k.end, k.start))
    out = []
    for i, k in enumerate(order):
        frontier = max([start] + [o.end for o in order[:i]])
        cells = range(round(k.start * 10), round(k.end * 10))
        out.append(sum(0.1 for c in cells if (c + 0.5) / 10 > frontier))
    return out


def test_parse_keeps_kernels_and_drops_host_labels():
    rng = random.Random()
    kernels = _random_kernels(rng, 30)
    labels = [Kernel(5.0, 300.0, "7", "_StepBucket.run"), Kernel(1.0, 0.8, "7", "DecodeStep.fill")]
    got = parse(_table(kernels, labels))
    assert sorted(got) == sorted(kernels)


def test_exposed_matches_a_grid_count():
    rng = random.Random()
    for _ in range(20):
        kernels = _random_kernels(rng, rng.randint(1, 40))
        got = exposed(kernels)
        assert [k for k, _ in got] == sorted(kernels, key=lambda k: (k.end, k.start))
        for (_, e), b in zip(got, _brute(kernels)):
            assert abs(e - b) < 1e-6
        start = round(rng.uniform(0, max(k.end for k in kernels)), 1)  # (on the grid: whole cells on either side)
        for (_, e), b in zip(exposed(kernels, start), _brute(kernels, start)):
            assert abs(e - b) < 1e-6


def test_a_chain_without_gaps_adds_up_to_its_window(tmp_path, capsys):
    """Back-to-back PDL launches (each scheduled before the previous one ends): the exposed times sum to the window."""
    rng = random.Random()
    kernels, t = [], 0.0
    for i in range(25):
        span = round(1 + 10 * rng.random(), 1)
        kernels.append(Kernel(t, span, "7", f"_k{i % 3}_kernel"))
        t = round(t + span - rng.choice([0.0, 0.4, 0.9]) * rng.random(), 1)  # the next starts before this one ends
        t = max(t, kernels[-1].start)
    window = max(k.end for k in kernels) - kernels[0].start
    assert abs(sum(e for _, e in exposed(kernels)) - window) < 1e-6
    path = tmp_path / "timeline.txt"
    path.write_text("\n".join(_table(kernels, [])) + "\n")
    main([str(path)])
    out = capsys.readouterr().out
    assert f"exposed {window:.1f} µs" in out and "_k0_kernel" in out
