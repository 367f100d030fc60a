"""Stop rules of a Sequence: stop strings across token boundaries (cut from the text, checked against
a brute force), stop tokens, EOS and length in their order, and stop strings end to end through the
scheduler driven by the fake paged model (_scheduler_helpers.py)."""
import random

from _scheduler_helpers import EOS, LARGE, MAX_LEN, TINY, Request, run_engine
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.sequence import Sequence


# ---- stop strings -----------------------------------------------------------------------------

PIECES = ["he", "llo", " wor", "ld", "<", "/", "s", ">", "</s>", "x", "yz", "!", "\n"]


def detok(ids: list[int]) -> str:
    return "".join(PIECES[i % len(PIECES)] for i in ids)


def test_stop_string_across_tokens_is_cut_from_text():
    seq = Sequence("s", [9], SamplingParams(stop=["lo w", "zz"]))
    for t in [0, 1]:
        seq.append_token(t)
        assert not seq.check_stop([EOS + 100], MAX_LEN, detok)
    seq.append_token(2)
    assert seq.check_stop([EOS + 100], MAX_LEN, detok)
    assert seq.finish_reason == "stop" and seq.stop_reason == "lo w"
    assert seq.output_text == "hel" and seq.output_token_ids == [0, 1, 2]


def test_stop_strings_against_brute_force():
    rng = random.Random(3)
    stops_pool = ["</s>", "s>", "yz!", "\n\n", "ld<", "o w"]
    for trial in range(200):
        stops = rng.sample(stops_pool, rng.randrange(1, 3))
        stream = [rng.randrange(len(PIECES)) for _ in range(25)]
        seq = Sequence("s", [1], SamplingParams(stop=stops, max_tokens=20))
        for i, t in enumerate(stream):
            seq.append_token(t)
            if seq.check_stop([], None, detok):
                break
        # Brute force: the first prefix whose text contains a stop string; cut at its earliest match.
        want_len, want_text, want_reason = None, None, "length"
        for k in range(1, 21):
            text = detok(stream[:k])
            found = [text.index(s) for s in stops if s in text]
            if found:
                want_len, want_text, want_reason = k, text[: min(found)], "stop"
                break
        if want_reason == "length":
            want_len, want_text = 20, detok(stream[:20])
        assert seq.num_output_tokens == want_len and seq.finish_reason == want_reason
        assert seq.output_text == want_text
        assert not any(s in seq.output_text for s in stops)


def test_stop_tokens_eos_and_length_order():
    seq = Sequence("a", [4], SamplingParams(stop_token_ids=[7], max_tokens=1))
    seq.append_token(7)
    assert seq.check_stop([EOS]) and seq.finish_reason == "stop" and seq.stop_reason == 7
    seq = Sequence("b", [4], SamplingParams(ignore_eos=True, max_tokens=2))
    seq.append_token(EOS)
    assert not seq.check_stop([EOS])
    seq.append_token(EOS)
    assert seq.check_stop([EOS]) and seq.finish_reason == "length"
    seq = Sequence("c", [4, 4], SamplingParams())
    seq.append_token(3)
    assert seq.check_stop([EOS], max_model_len=3) and seq.finish_reason == "length"


def test_stop_strings_end_to_end():
    reqs = [Request(f"r{i}", [1 + i, 2, 3], SamplingParams(temperature=1.0, seed=i, stop=["s>", "ld"],
                                                          max_tokens=40, ignore_eos=True)) for i in range(6)]
    outs_a, _, _ = run_engine(reqs, budget=4, max_seqs=3, pages=TINY, detokenize=detok)
    outs_b, _, _ = run_engine(reqs, budget=64, max_seqs=8, pages=LARGE, detokenize=detok)
    assert outs_a == outs_b
    stopped = [rid for rid, (_, reason) in outs_a.items() if reason == "stop"]
    assert stopped
    for rid in stopped:
        text = detok(outs_a[rid][0])
        assert ("s>" in text or "ld" in text) and not any(s in detok(outs_a[rid][0][:-1]) for s in ("s>", "ld"))
