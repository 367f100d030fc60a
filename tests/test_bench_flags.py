"""bench/flags.py: module flags set from `module.NAME=literal` strings for A/B runs, and put back."""
from __future__ import annotations

import pytest

from bench.flags import apply, restore


def test_apply_sets_and_restore_puts_back():
    import dsv4.kernels.moe_wide as mw

    before = (mw.ASYNC_STAGES, mw.DOWN_ONE_WARPGROUP)
    old = apply(["dsv4.kernels.moe_wide.ASYNC_STAGES=7", "dsv4.kernels.moe_wide.DOWN_ONE_WARPGROUP=True"])
    assert (mw.ASYNC_STAGES, mw.DOWN_ONE_WARPGROUP) == (7, True)
    restore(old)
    assert (mw.ASYNC_STAGES, mw.DOWN_ONE_WARPGROUP) == before


@pytest.mark.parametrize("bad,match", [("dsv4.kernels.moe_wide.NO_SUCH_FLAG=1", "no attribute"),
                                       ("dsv4.kernels.moe_wide.ASYNC=yes", "literal"),
                                       ("ASYNC=1", "module.NAME=value")])
def test_bad_settings_name_the_problem(bad, match):
    with pytest.raises(SystemExit, match=match):
        apply([bad])
