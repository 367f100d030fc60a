"""Session 51: where test_site_sums_the_pending_combine[0-True-20] differs on the GPU (X' of the prefill-tile mix
with the combine summed in, against the combine's launch then the site): counts, places, repeatability."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
import test_site_fusions as T  # noqa: E402
from dsv4.kernels import mhc  # noqa: E402
from dsv4.kernels.moe_combine import combine, deferred  # noqa: E402

for t, ranges, shared in [(20, 0, True), (20, 0, False), (20, 2, True), (16, 0, True), (17, 0, True), (33, 0, True)]:
    gen = torch.Generator("cuda").manual_seed(31 * t + 7 * ranges + shared)
    (y, sh, ids, out, experts), (x, post, comb, fn, base, scale, w) = T._site_inputs(t, ranges, shared, gen)
    mix = mhc.prepare_mix(fn)
    f = combine(y, sh, ids, out.clone(), experts)
    want = mhc.hc_post_pre(f, x, post, comb, mix, base, scale, norm_weight=w, **T.KW)
    gots = []
    for _ in range(3):
        with deferred():
            pending = combine(y, sh, ids, out.clone(), experts)
        gots.append(mhc.hc_post_pre(pending, x, post, comb, mix, base, scale, norm_weight=w, **T.KW))
    again = mhc.hc_post_pre(f, x, post, comb, mix, base, scale, norm_weight=w, **T.KW)
    a, b = gots[0][0], want[0]
    bad = (a != b) & ~(a.isnan() & b.isnan())
    idx = bad.nonzero()
    print(f"t={t} ranges={ranges} shared={shared}: X' differs at {int(bad.sum())} of {a.numel()}; "
          f"repeat same {all(torch.equal(g[0], a) for g in gots)}; want repeat same {torch.equal(again[0], b)}; "
          f"nan in want {int(b.isnan().sum())} got {int(a.isnan().sum())}")
    if len(idx):
        print("   tokens", sorted(set(idx[:, 0].tolist()))[:20], "streams", sorted(set(idx[:, 1].tolist())),
              "cols", idx[:8, 2].tolist(), "got", a[bad][:4].tolist(), "want", b[bad][:4].tolist())
        print("   f at those:", f[idx[:4, 0], idx[:4, 2]].tolist())
