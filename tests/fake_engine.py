"""An EngineCore for server tests: the real Scheduler, BlockManager, Sampler, IncrementalDetokenizer
(via OutputTracker) and ChatTokenizer around a scripted fake model.

The fake model's logits are a deterministic function of the sequence: the token the "script" of the
prompt wants at this output position gets +SCRIPT_MARGIN over a fixed pseudo-random row chosen by
the previous token. Greedy decoding therefore reproduces the script exactly, and tests can state the
expected text from the rules below without running anything:

  chat prompt (ends with the Assistant marker), q = text of the last user turn:
    thinking mode        reasoning "The user wrote {len(q)} characters." then </think>
    q has <tool_result>R</tool_result>   answer "The tool said: R"
    tools offered and q says "weather in CITY"   a DSML call of the first tool with {"city": CITY}
    otherwise            answer "You said: {q}"
    then EOS
  raw completion prompt p:
    "[eos]" in p         " ok" then EOS
    otherwise            " 1 2 3 4 ..." (never ends; max_tokens or max_model_len stop it)
  "[stall]" in a prompt: the next step sleeps `stall_seconds` (watchdog tests).

Run as a script it starts the real server (dsv4.serve.server.serve) on this core:
    python tests/fake_engine.py --tokenizer-dir DIR [dsv4 serve options] [--step-delay S]
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4.chat.encoding import (ASSISTANT, BOS, DSML, EOS, LATEST_REMINDER, TASK_TOKENS, THINK_CLOSE,  # noqa: E402
                                THINK_OPEN, USER)
from dsv4.chat.tokenizer import ChatTokenizer, load_tokenizer  # noqa: E402
from dsv4.engine.block_manager import BlockManager, make_page_kinds  # noqa: E402
from dsv4.engine.outputs import EngineStats, OutputTracker, RequestOutput, TokenLogprob  # noqa: E402
from dsv4.engine.sampler import Sampler, token_logprobs  # noqa: E402
from dsv4.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from dsv4.engine.sequence import Sequence  # noqa: E402
from dsv4.engine.structured import Grammars  # noqa: E402

SPECIALS = [BOS, EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE, DSML, LATEST_REMINDER, *TASK_TOKENS.values()]
CORPUS = [
    "You said: hello there. The tool said: sunny, 21 degrees. What is the weather in Paris?",
    "The user wrote 12 characters. Reasoning about the question, then answering it.",
    '<tool_result>{"temperature": 21, "sky": "clear"}</tool_result> get_weather city string true false',
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 ok [eos] [stall] count numbers",
    "Grüße, 你好世界, emoji 😀 — café naïve, ½ ∑ “quotes”",
] * 4
SCRIPT_MARGIN = 12.0
COUNTING = " " + " ".join(str(i) for i in range(1, 1000))
# A DeepSeek-V4-like layer schedule: sliding window, CSA (ratio 4, with indexer) and HCA (ratio 128).
COMPRESS_RATIOS = (0, 4, 128, 4)
WINDOW = 32
PAGE_SIZES = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}


def train_tokenizer(vocab_size: int = 600) -> Tokenizer:
    """A small byte-level BPE with the DeepSeek-V4 chat special strings as added tokens (< 1 s)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def write_tokenizer(directory: Path) -> ChatTokenizer:
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(directory / "tokenizer.json"))
    tok = load_tokenizer(directory)
    assert tok is not None
    return tok


def dsml_call(name: str, args: dict[str, str]) -> str:
    params = "\n".join(f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>' for k, v in args.items())
    return (f"\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"{name}\">\n{params}\n</{DSML}invoke>\n"
            f"</{DSML}tool_calls>")


def script_text(prompt: str) -> str:
    """What the fake model says after `prompt` (see the module docstring)."""
    if not (prompt.endswith(ASSISTANT + THINK_OPEN) or prompt.endswith(ASSISTANT + THINK_CLOSE)):
        return " ok" + EOS if "[eos]" in prompt else COUNTING
    turn_start = prompt.rfind(USER)
    question = prompt[turn_start + len(USER): prompt.rfind(ASSISTANT)] if turn_start >= 0 else ""
    thinking = prompt.endswith(ASSISTANT + THINK_OPEN)
    tools = re.findall(r'\{"name": "([^"]+)"', prompt) if "## Tools" in prompt else []
    result = re.search(r"<tool_result>(.*?)</tool_result>", question, re.S)
    city = re.search(r"weather in ([A-Za-z]+)", question)
    if result:
        answer = f"The tool said: {result.group(1)}"
    elif tools and city:
        answer = dsml_call(tools[0], {"city": city.group(1)})
    else:
        answer = f"You said: {question}"
    reasoning = f"The user wrote {len(question)} characters.{THINK_CLOSE}" if thinking else ""
    return reasoning + answer + EOS


class ScriptedModel:
    def __init__(self, tokenizer: ChatTokenizer, seed: int = 0):
        self.tok = tokenizer
        v = tokenizer.vocab_size
        self.noise = torch.randn(v, v, generator=torch.Generator().manual_seed(seed))
        self._scripts: dict[tuple[int, ...], list[int]] = {}   # prompt ids -> script ids
        self._encoded: dict[str, list[int]] = {}                # script text -> script ids

    def script_ids(self, prompt_ids: list[int]) -> list[int]:
        key = tuple(prompt_ids)
        ids = self._scripts.get(key)
        if ids is None:
            if len(self._scripts) > 4096:
                self._scripts.clear()
                self._encoded.clear()
            text = script_text(self.tok.decode(prompt_ids))
            ids = self._encoded.get(text)
            if ids is None:
                ids = self._encoded[text] = self.tok.encode(text)
            self._scripts[key] = ids
        return ids

    def logits(self, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
        script = self.script_ids(prompt_ids)
        target = script[len(output_ids) % len(script)]
        row = self.noise[(output_ids or prompt_ids)[-1]].clone()
        row[target] += SCRIPT_MARGIN
        return row


class FakeCore:
    """EngineCore protocol (see dsv4/engine/async_engine.py) with real page accounting."""

    def __init__(self, tokenizer: ChatTokenizer, *, max_model_len: int = 256, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 4096, pages_per_seq: int = 4,
                 step_delay: float = 0.0, stall_seconds: float = 0.0, model_name: str = "dsv4-fake"):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.vocab_size = tokenizer.vocab_size
        self.model_name = model_name
        self.max_model_len = max_model_len
        n = pages_per_seq * max_num_seqs
        pages = {"window": n, "compressed4": n, "indexer4": n, "compressed128": n, "state": max_num_seqs}
        for kind in make_page_kinds(COMPRESS_RATIOS, WINDOW, PAGE_SIZES, pages):   # one full-length sequence fits
            pages[kind.name] = max(pages[kind.name], kind.pages_needed(max_model_len))
        self.block_manager = BlockManager(make_page_kinds(COMPRESS_RATIOS, WINDOW, PAGE_SIZES, pages))
        self.scheduler = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len),
                                   self.block_manager, eos_token_ids=tokenizer.eos_id,
                                   detokenize=lambda ids: tokenizer.decode(ids))
        self.sampler = Sampler()
        self.grammars = Grammars(tokenizer, self.vocab_size, [tokenizer.eos_id])
        self.model = ScriptedModel(tokenizer)
        self.step_delay = step_delay
        self.stall_seconds = stall_seconds
        self._stall_next = False
        self._trackers: dict[str, OutputTracker] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params) -> None:
        seq = Sequence(request_id, prompt_token_ids, params)
        if any(t >= self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"request {request_id!r}: token id outside the vocabulary")
        if params.structured is not None:  # as LLMEngine: the grammar's masks apply in the sampler
            seq.grammar = self.grammars.state(params.structured)
        self.scheduler.add(seq)
        self._trackers[request_id] = OutputTracker(request_id, prompt_token_ids, params, self.tokenizer)
        self.prompt_tokens_total += len(prompt_token_ids)
        if self.stall_seconds and "[stall]" in self.tokenizer.decode(prompt_token_ids):
            self._stall_next = True

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort(request_id)
        self._trackers.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return not self.scheduler.is_finished()

    def step(self) -> list[RequestOutput]:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self._stall_next:
            self._stall_next = False
            time.sleep(self.stall_seconds)
        batch = self.scheduler.schedule()
        if not batch.rows:
            return []
        for row in batch.rows:  # prompt logprobs: position p's logits are the noise row of the token there
            seq, todo = row.seq, row.seq.prompt_positions_to_score(row.start, row.num_tokens)
            if seq.params.prompt_logprobs is not None and todo:
                logits = self.model.noise[seq.token_ids[todo.start: todo.stop]]
                seq.prompt_logprobs.extend(token_logprobs(logits, seq.token_ids[todo.start + 1: todo.stop + 1],
                                                          seq.params.prompt_logprobs))
        sampled = [i for i, r in enumerate(batch.rows) if r.sample]
        tokens: list[int | None] = [None] * len(batch.rows)
        lps: dict[int, list[TokenLogprob] | None] = {}
        if sampled:
            seqs = [batch.rows[i].seq for i in sampled]
            logits = torch.stack([self.model.logits(s.prompt_token_ids, s.output_token_ids) for s in seqs])
            out = self.sampler.sample_sequences(logits, seqs)
            for i, tok, lp in zip(sampled, out.token_ids, out.logprobs):
                tokens[i] = tok
                lps[i] = None if lp is None else [TokenLogprob(tok, lp.logprob, lp.top)]
        self.scheduler.postprocess(batch, tokens)
        outputs = []
        for i in sampled:
            seq = batch.rows[i].seq
            if seq.grammar is not None:
                seq.grammar.advance(seq.output_token_ids)
            self.generation_tokens_total += 1
            delta = self._trackers[seq.request_id].update(seq, [seq.token_ids[-1]], lps[i])
            if seq.is_finished:
                del self._trackers[seq.request_id]
            if delta is not None:
                outputs.append(delta)
        return outputs

    def stats(self) -> EngineStats:
        bm = self.block_manager
        usage = bm.usage()
        return EngineStats(
            num_waiting=self.scheduler.num_waiting, num_running=self.scheduler.num_running,
            cache_usage=max(usage.values()), free_pages=sum(bm.num_free(k) for k in bm.kinds),
            total_pages=sum(bm.num_total(k) for k in bm.kinds), prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total, num_preemptions=self.scheduler.num_preemptions,
            page_usage=usage)


class ServerProcess:
    """A real server process on a free 127.0.0.1 port (tests only): this file's fake core by default,
    or `dsv4 serve` itself with `ServerProcess.cli(...)`.

    Every wait is bounded; `stop()` sends SIGTERM and returns the exit status (SIGKILL after `timeout`)."""

    def __init__(self, tokenizer_dir: Path | None, log_path: Path, *args: str, cli: bool = False):
        self.log_path = log_path
        if cli:
            cmd = [sys.executable, "-m", "dsv4", "serve"]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--tokenizer-dir", str(tokenizer_dir)]
        cmd += ["--host", "127.0.0.1", "--port", "0", *args]
        repo = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
        env.pop("DSV4_API_KEY", None)
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.base_url = self._wait_for_url(timeout=180)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", self.log())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()

    def stop(self, timeout: float = 20.0) -> int | None:
        self.signal(signal.SIGTERM)
        rc = self.wait(timeout)
        self.kill()
        return rc


def main(argv: list[str] | None = None) -> int:
    from dsv4.serve import cli_serve
    from dsv4.serve.server import exit_process, serve

    p = argparse.ArgumentParser(description="dsv4 server on the scripted fake engine (tests only)")
    cli_serve.add_arguments(p)
    p.add_argument("--tokenizer-dir", required=True, help="directory with the test tokenizer.json")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds each step sleeps (a slower model)")
    p.add_argument("--stall-seconds", type=float, default=0.0, help="how long a '[stall]' prompt stalls a step")
    p.add_argument("--pages-per-seq", type=int, default=4, help="page pool size per --max-num-seqs")
    args = p.parse_args(argv)
    tok = load_tokenizer(args.tokenizer_dir)
    if tok is None:
        raise SystemExit(f"{args.tokenizer_dir}: no tokenizer.json")
    core = FakeCore(tok, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                    max_num_batched_tokens=args.max_num_batched_tokens, pages_per_seq=args.pages_per_seq,
                    step_delay=args.step_delay, stall_seconds=args.stall_seconds)
    exit_process(serve(core, cli_serve.serve_options(args, core.model_name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
