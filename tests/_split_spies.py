"""Spies on dsv4.model.mixed_steps' two entry points (CPU and GPU tests of the mixed-step split)."""
from __future__ import annotations

from dsv4.model import mixed_steps


def count_splits(monkeypatch) -> tuple[list[bool], list[bool]]:
    """Lists that record, per call of the model's and of the MTP block's split, whether the batch was split."""
    found: tuple[list[bool], list[bool]] = ([], [])
    for seen, name, where in ((found[0], "split_mixed_step", "dsv4.model.deepseek_v4"),
                              (found[1], "split_mixed_mtp", "dsv4.model.mtp")):
        real = getattr(mixed_steps, name)

        def spy(*args, real=real, seen=seen):
            out = real(*args)
            seen.append(out is not None)
            return out

        monkeypatch.setattr(f"{where}.{name}", spy)
    return found
