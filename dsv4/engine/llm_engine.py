"""The engine core: scheduler + cache + model runner + sampler + detokenizer, one `step()` at a time.

Device-agnostic: the model decides where tensors live; the engine only moves token ids in and
sampled ids out. `AsyncEngine` (server) and `LLM` (Python API) both drive this class.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ModelConfig
from ..model import prefill_graphs
from ..model.context import HostCopy, to_device
from .block_manager import BlockManager
from .cache import CacheConfig, HybridCache
from .memory_fit import fits, free_memory, load_fitting
from .outputs import EngineStats, OutputTracker, RequestOutput, TokenLogprob
from .prefix_snapshots import PrefixSnapshots
from .prompt_sharing import MIN_SHARED_TOKENS, PromptSharing
from .retention import RetainedSequences
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from .sequence import Sequence
from .spec_decode import SPECULATIVE_METHODS, MTPSpeculator, mtp_problem
from .structured import Grammars

log = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    max_num_seqs: int = 64
    # tokens per step: an eager prefill forward costs ~11 ms of host time per Flash layer, so smaller chunks are
    # host-bound (H200, 8 layers, one 8K prompt: 409 ms in 2048-token forwards, 208 in 4096, 117 in one 8192;
    # bench/runs/run_device_s28i.sh). Longer prompts still go in 8192-token steps, which the GPU's time covers
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    cache: CacheConfig | None = None
    speculative: str | None = None   # "mtp": draft with the checkpoint's mtp.0 block (docs/speculative.md)
    num_draft_tokens: int = 1        # draft tokens per decode step when speculative is set
    # cache storage (CacheConfig.kv_dtype) unless `cache` is given. None: `default_kv_dtype(model)`, FP8 on a GPU
    kv_dtype: str | None = None
    # launch the next decode step before reading this one's ids (`LLMEngine.step`). None: where the model is on a
    # GPU (on the CPU nothing runs beside the host, and each step's outputs would wait for the next step's forward)
    overlap: bool | None = None
    # finished sequences kept with their cache for a prompt that continues them (dsv4.engine.retention); 0: off
    retain_finished: int = 0
    # a request whose prompt a running sequence is computing waits for it and copies its cache
    # (dsv4.engine.prompt_sharing): n choices and repeated prompts compute the prompt once
    share_prompts: bool = True
    # snapshots of prompt prefixes that several requests share, kept for the next requests with them (a system
    # prompt; dsv4.engine.prefix_snapshots; needs share_prompts); 0: off
    prefix_snapshots: int = 0
    # tokens of context the cache holds over all sequences (its compressed-entry pages; `dsv4 plan` says how many
    # fit a GPU). None: max_num_seqs * max_model_len / 4, at least two sequences at full length
    cache_tokens: int | None = None
    # with CUDA graphs, forwards of up to this many tokens run as prefill pieces (dsv4.model.prefill_graphs; 0: none,
    # the memory they take, ≈ 1.3 GiB for Flash at 2048, stays free). None: prefill_graphs.PREFILL_MAX_TOKENS
    prefill_graph_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.speculative not in (None, *SPECULATIVE_METHODS):
            raise ValueError(f"EngineConfig.speculative={self.speculative!r}; expected None or one of "
                             f"{SPECULATIVE_METHODS}")
        r = self.retain_finished
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise ValueError(f"EngineConfig.retain_finished={r!r}; expected an integer >= 0 (0 = off)")
        if not isinstance(self.share_prompts, bool):
            raise ValueError(f"EngineConfig.share_prompts={self.share_prompts!r}; expected True or False")
        p = self.prefix_snapshots
        if not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise ValueError(f"EngineConfig.prefix_snapshots={p!r}; expected an integer >= 0 (0 = off)")
        if p and not self.share_prompts:
            raise ValueError("EngineConfig.prefix_snapshots needs share_prompts=True (snapshots are forked)")
        n, top = self.prefill_graph_tokens, max(prefill_graphs.PREFILL_BUCKETS)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= top):
            raise ValueError(f"EngineConfig.prefill_graph_tokens={n!r}; expected None or 0 (off) to {top} (the "
                             "largest prefill bucket)")
        t = self.cache_tokens
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
            raise ValueError(f"EngineConfig.cache_tokens={t!r}; expected an integer >= 1 or None")

    @property
    def decode_step_rows(self) -> int:
        """Most token rows of one decode step: every sequence brings 1 token, or 1 + the drafts when a
        speculative step verifies them (so CUDA graphs must cover that many rows, not max_num_seqs), within
        the step's token budget. Graph buckets end at 128 rows (dsv4.model.graphs.BUCKETS): larger steps run
        eagerly."""
        rows = self.max_num_seqs * (1 + self.num_draft_tokens if self.speculative else 1)
        return min(rows, self.max_num_batched_tokens)


class LLMEngine:
    def __init__(self, model, config: ModelConfig, tokenizer=None, engine_config: EngineConfig | None = None,
                 model_name: str = "dsv4"):
        ec = engine_config or EngineConfig()
        self.model = model
        if getattr(model, "_graphs", None) is not None and ec.prefill_graph_tokens is not None:
            model._graphs.prefill_limit = ec.prefill_graph_tokens
        self.config = config
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.eos_token_id = config.eos_token_id
        self.vocab_size = config.vocab_size
        self.max_model_len = min(ec.max_model_len, config.max_position_embeddings)
        self.device = next(model.parameters()).device
        if ec.cache_tokens is not None and ec.cache_tokens < self.max_model_len:
            raise ValueError(f"cache_tokens={ec.cache_tokens} is less than max_model_len={self.max_model_len}: a "
                             "request of full length would never fit; raise the one or lower the other")
        cache_cfg = ec.cache or CacheConfig.for_capacity(config, max_num_seqs=ec.max_num_seqs,
                                                          max_model_len=self.max_model_len,
                                                          total_tokens=ec.cache_tokens,
                                                          kept_states=ec.retain_finished + ec.prefix_snapshots,
                                                          kv_dtype=ec.kv_dtype or default_kv_dtype(model))
        self.cache, oom = fits(lambda: HybridCache(config, cache_cfg, dtype=model.dtype, device=self.device))
        if oom is not None:
            size = f"--cache-tokens {ec.cache_tokens}" if ec.cache_tokens else "the default size"
            raise ValueError(f"the cache ({size}, {ec.max_num_seqs} sequences of up to {self.max_model_len} tokens, kv "
                             f"{cache_cfg.kv_dtype}) does not fit in the GPU's memory{free_memory(self.device)}: lower "
                             f"--cache-tokens, --max-num-seqs or --max-model-len (`dsv4 plan` prints what fits). "
                             f"{oom}")
        self.block_manager: BlockManager = self.cache.block_manager
        detok = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None
        self.sampler = Sampler()
        self.speculator = MTPSpeculator(model, self.cache, self.sampler, ec.num_draft_tokens) \
            if ec.speculative == "mtp" else None
        drafts = ec.num_draft_tokens if self.speculator is not None else 0
        self.scheduler = Scheduler(SchedulerConfig(ec.max_num_seqs, ec.max_num_batched_tokens, self.max_model_len,
                                                   drafts),
                                   self.block_manager, eos_token_ids=self.eos_token_id, detokenize=detok)
        self.retained = (RetainedSequences(ec.retain_finished, self.cache, mtp=self.speculator is not None)
                         if ec.retain_finished else None)
        mtp = self.speculator is not None
        self.snapshots = PrefixSnapshots(ec.prefix_snapshots, self.cache, mtp) if ec.prefix_snapshots else None
        self.sharing = PromptSharing(self.cache, mtp, self.snapshots) if ec.share_prompts else None
        if self.retained is not None:
            self.scheduler.keep_finished = True
            if self.sharing is not None:
                self.retained.fork = self.sharing.fork_from
        if self.retained is not None or self.snapshots is not None:
            self.scheduler.reclaim = self._reclaim
        if self.retained is not None or self.sharing is not None:
            self.scheduler.adopt = self._adopt
            self.scheduler.give_back = self._give_back
        self.grammars = Grammars(tokenizer, self.vocab_size, [config.eos_token_id])
        self.grammars.prepare()
        self.streams: dict[str, OutputTracker] = {}  # text deltas per running request
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.overlap = ec.overlap if ec.overlap is not None else self.device.type == "cuda"
        self._pending: _Launched | None = None  # the look-ahead batch launched by the last step
        self.look_ahead_steps = self.look_ahead_wasted_rows = 0

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, device: str = "auto", dtype: torch.dtype | None = None,
                        numerics: str = "reference", engine_config: EngineConfig | None = None,
                        kernels: str = "auto", cuda_graphs: bool | None = None) -> "LLMEngine":
        """cuda_graphs: decode steps as CUDA graphs (one GPU; dsv4.model.graphs); None: where the model can
        (`graphs_by_default`)."""
        from ..chat.tokenizer import load_tokenizer
        from .assets import default_model_path
        path = Path(path) if path is not None else default_model_path()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype is None:
            dtype = torch.bfloat16 if device != "cpu" else torch.float32
        speculative = engine_config is not None and engine_config.speculative is not None
        problem = mtp_problem(path) if (path / "config.json").is_file() else None
        if speculative and problem:
            raise ValueError(f"speculative={engine_config.speculative!r} needs the checkpoint's complete MTP "
                             f"block mtp.0: {problem}")
        if problem:
            log.warning("no usable MTP block (speculative decoding unavailable): %s", problem)
        model = load_fitting(path, device, dtype=dtype, numerics=numerics, include_mtp=speculative, kernels=kernels)
        if graphs_by_default(model) if cuda_graphs is None else cuda_graphs:
            model.enable_cuda_graphs(max_batch=(engine_config or EngineConfig()).decode_step_rows)
        tokenizer = load_tokenizer(path)
        return cls(model, model.config, tokenizer, engine_config, model_name=path.name)

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None) -> None:
        params = params or SamplingParams()
        bad = [t for t in prompt_token_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"request {request_id!r}: token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        bad = [t for t in params.logit_bias or {} if t >= self.vocab_size]
        if bad:
            raise ValueError(f"request {request_id!r}: logit_bias token id {bad[0]} outside the vocabulary "
                             f"[0, {self.vocab_size})")
        seq = Sequence(request_id, prompt_token_ids, params)
        if params.max_tokens is not None and seq.num_prompt_tokens + params.max_tokens > self.max_model_len:
            raise ValueError(f"request {request_id!r}: prompt ({seq.num_prompt_tokens}) + max_tokens "
                             f"({params.max_tokens}) exceeds max_model_len={self.max_model_len}")
        if params.structured is not None:
            try:
                seq.grammar = self.grammars.state(params.structured)
            except ValueError as e:
                raise ValueError(f"request {request_id!r}: {e}") from None
        self.scheduler.add(seq)
        self.streams[request_id] = OutputTracker(request_id, seq.prompt_token_ids, params, self.tokenizer)
        self.prompt_tokens_total += seq.num_prompt_tokens

    def _adopt(self, seq: Sequence) -> bool:
        """The scheduler admits fresh `seq`: a retained sequence its prompt extends becomes its cache, else a copy
        of a running sequence's or of a prefix snapshot's; with prefix snapshots, seq may also be told where to end
        a chunk to keep one (none of this for prompt logprobs, which score the prompt from its first token).
        False: seq should wait, a running sequence is computing the prompt seq starts with."""
        if seq.params.prompt_logprobs is not None:
            return True
        state = self.retained.adopt(seq) if self.retained is not None else None
        if state is None and self.sharing is not None:
            if self.sharing.source_computing(seq, self.scheduler.running):
                return False
            state = self.sharing.fork(seq, self.scheduler.running)
        if state is not None:
            self.cache.states[seq.request_id] = state
        seq.num_cached_tokens = seq.num_computed_tokens
        if self.snapshots is not None:
            seq.snapshot_at = self.snapshots.note(seq)
        k = seq.params.retain_prefix  # (a copy of fewer tokens than a fork takes is not worth its launches)
        if (self.retained is not None and k is not None and max(seq.num_computed_tokens + 1, MIN_SHARED_TOKENS) <= k
                <= seq.num_prompt_tokens):
            seq.retain_at = k  # a chunk ends there and a copy of the cache is retained (RetainedSequences.keep_prefix)
        return True

    def _reclaim(self) -> bool:
        """Free cache pages that nobody runs on: a retained sequence's (oldest first), else a prefix snapshot's."""
        return ((self.retained is not None and self.retained.evict_oldest())
                or (self.snapshots is not None and self.snapshots.evict_oldest()))

    def _give_back(self, seq: Sequence) -> None:
        """Undo `_adopt` for a waiting `seq` that then did not fit."""
        if self.sharing is None or not self.sharing.undo(seq):
            self.retained.give_back(seq, self.cache.states.pop(seq.request_id))
        elif self.retained is not None:
            self.retained.undo_fork(seq)
        seq.num_cached_tokens = 0

    def abort_request(self, request_id: str) -> None:
        seq = self.scheduler.abort(request_id)
        if seq is not None:
            self.cache.release(seq)
        self.streams.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return not self.scheduler.is_finished()

    @property
    def cuda_graphs(self) -> bool:
        """Whether the model's decode steps run as CUDA graphs (`graphs_by_default` or asked for)."""
        return getattr(self.model, "_graphs", None) is not None

    def capture_prefill_graphs(self) -> str:
        """Capture the short-prefill pieces of every token bucket now (`dsv4 serve` at startup, where graphs are on):
        one line saying what was done, or "" with nothing to do."""
        graphs = getattr(self.model, "_graphs", None)
        if graphs is None or not graphs.capture:
            return ""
        t, limit, mtp = time.perf_counter(), graphs.prefill_limit, self.speculator is not None
        sizes = graphs.capture_prefill(mtp=mtp)
        short = (f"; larger buckets did not fit in GPU memory: prefills of more than {graphs.prefill_limit} tokens "
                 "run eagerly" if graphs.prefill_limit != limit else "")
        if not sizes:
            return short.removeprefix("; ")
        what = "prefill graphs (and the MTP block's)" if mtp else "prefill graphs"
        return f"{what} for {sizes[0]}-{sizes[-1]} tokens captured in {time.perf_counter() - t:.1f} s{short}"

    def describe(self) -> str:
        """How this engine runs, in one line (serve's startup line): device and dtype, cache storage and size, CUDA
        graphs, overlap, speculation -- the defaults resolved (`default_kv_dtype`, `graphs_by_default`)."""
        dtype = str(self.model.dtype).removeprefix("torch.")
        limit = prefill_graphs.max_prefill_tokens(self.model._graphs.prefill_limit if self.cuda_graphs else None)
        graphs = "off" if not self.cuda_graphs else "on" + (f", prefills of up to {limit} tokens piecewise" if limit
                                                            else "")
        spec = f", MTP drafting {self.speculator.num_draft_tokens} per step" if self.speculator is not None else ""
        return (f"{self.device.type} {dtype}, cache {self.cache.cache_config.kv_dtype} "
                f"{self.cache.pools.nbytes() / 2**30:.2f} GiB, CUDA graphs {graphs}, "
                f"overlap {'on' if self.overlap else 'off'}{spec}")

    def stats(self) -> EngineStats:
        bm = self.block_manager
        usage = bm.usage()
        free = sum(bm.num_free(k) for k in bm.kinds)
        total = sum(bm.num_total(k) for k in bm.kinds)
        stats = EngineStats(self.scheduler.num_waiting, self.scheduler.num_running, max(usage.values(), default=0.0),
                            free, total, self.prompt_tokens_total, self.generation_tokens_total,
                            self.scheduler.num_preemptions, page_usage=usage, shared_pages=bm.num_shared(),
                            look_ahead_steps=self.look_ahead_steps,
                            look_ahead_wasted_rows=self.look_ahead_wasted_rows)
        if self.retained is not None:
            r = self.retained
            stats.num_retained, stats.num_adopted, stats.adopted_tokens = len(r), r.num_adopted, r.num_tokens_reused
        if self.sharing is not None:
            stats.num_forks, stats.shared_prompt_tokens = self.sharing.num_forks, self.sharing.num_tokens_shared
        if self.snapshots is not None:
            stats.num_snapshots, stats.snapshots_taken = len(self.snapshots), self.snapshots.num_taken
        if self.speculator is not None:
            spec = self.speculator.stats
            stats.spec_num_drafts = spec.num_drafts
            stats.spec_draft_tokens = spec.num_draft_tokens
            stats.spec_accepted_tokens = spec.num_accepted_tokens
        return stats

    # ---- one step ------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, run and sample one batch; return the requests' new outputs.

        Overlap: while every row of the batch samples plainly (no speculator, penalties or logprobs) and
        nobody waits, the step picks the ids on the device, launches the next batch (each row's next token,
        fed with those ids) and only then reads the ids back, so the host's bookkeeping of this step and its
        preparation of the next run while the GPU computes; the next `step()` takes that batch as launched.
        A look-ahead row whose sequence stops on the id read back is computed for nothing and skipped. A look-ahead
        batch with grammar rows is launched without its pick (their masks need the ids read back after the launch):
        the next `step()` picks it, behind its forward on the device."""
        launched, self._pending = self._pending, None
        if launched is not None:
            stopped = sum(r.seq.is_finished for r in launched.batch.rows)
            self.look_ahead_wasted_rows += stopped
            if stopped == len(launched.batch.rows):
                self.scheduler.discard(launched.batch)  # every row stopped or was aborted since
                launched = None
        if launched is None:
            batch: ScheduledBatch = self.scheduler.schedule()
            if self.sharing is not None:
                self.sharing.flush()
            for seq in batch.preempted:
                self.cache.release(seq)
            if not batch.rows:
                return []
            if self.speculator is not None:
                self.speculator.propose(batch)
            logits = self.cache.run(self.model, batch)
            if self.speculator is None:  # (with MTP the copies wait for its state, advanced after sampling)
                self._keep_copies(batch)
        else:
            batch = launched.batch
        ahead = self._may_look_ahead(batch)
        if launched is None and ahead:
            launched = _Launched(batch, self.sampler.pick_sequences(logits, batch.seqs))
        sample_rows = [i for i, r in enumerate(batch.rows) if r.sample]
        sampled: list = [None] * len(batch.rows)
        logprobs: list = [None] * len(batch.rows)
        if launched is not None:
            if ahead:
                self._pending = self._look_ahead(batch, launched.ids())
            sampled = launched.read()
        elif self.speculator is not None:  # per row: the emitted tokens, a TokenLogprob list
            sampled, logprobs = self.speculator.verify(batch, logits)
        elif sample_rows:
            out = self.sampler.sample_sequences(logits, [batch.rows[i].seq for i in sample_rows])
            for j, i in enumerate(sample_rows):
                sampled[i], logprobs[i] = out.token_ids[j], out.logprobs[j]
        finished = self.scheduler.postprocess(batch, sampled)
        for i in sample_rows:
            grammar = batch.rows[i].seq.grammar
            if grammar is not None:
                grammar.advance(batch.rows[i].seq.output_token_ids)
        for seq in finished:
            if self.retained is not None:  # the scheduler left the pages with the sequence
                state = self.cache.states.pop(seq.request_id, None)
                self.retained.keep(seq, None if _retains_prefix(seq) else state)  # (None: its pages freed)
            else:
                self.cache.release(seq)
        if self.speculator is not None:
            self.speculator.advance(batch)
            self._keep_copies(batch)
        outputs = []
        for i in sample_rows:
            seq = batch.rows[i].seq
            tracker = self.streams.get(seq.request_id)
            if tracker is None:  # aborted meanwhile
                continue
            new = seq.output_token_ids[tracker.num_tokens:]
            self.generation_tokens_total += len(new)
            lp = logprobs[i]
            if isinstance(lp, list):
                lps = lp[: len(new)]  # tokens after a stop were dropped
            else:
                lps = [TokenLogprob(sampled[i], lp.logprob, lp.top)] if lp is not None else None
            out = tracker.update(seq, new, lps)
            if out is not None:
                outputs.append(out)
            if seq.is_finished:
                del self.streams[seq.request_id]
        return outputs

    def _keep_copies(self, batch: ScheduledBatch) -> None:
        """Copies of the cache of the rows whose chunk just ended at their snapshot or retain point. Queued right
        after the forward, before anything later (a look-ahead) writes the cache: the copy is one stream-ordered
        launch (`dsv4.kernels.page_copy`). With MTP, once its state has advanced too."""
        for row in batch.rows if self.snapshots is not None or self.retained is not None else ():
            seq = row.seq
            if seq.is_finished or seq.request_id not in self.cache.states:
                continue
            state = self.cache.states[seq.request_id]
            if seq.snapshot_at and state.num_tokens == seq.snapshot_at:
                self.snapshots.take(seq, state)
            if seq.retain_at and state.num_tokens == seq.retain_at:
                self.retained.keep_prefix(seq, state)

    def _may_look_ahead(self, batch: ScheduledBatch) -> bool:
        return (self.overlap and self.speculator is None and not self.scheduler.waiting
                and all(r.sample and not r.num_draft_tokens and not r.seq.params.has_penalties
                        and r.seq.params.logprobs is None for r in batch.rows))

    def _look_ahead(self, batch: ScheduledBatch, ids: torch.Tensor) -> "_Launched | None":
        """Launch the next token of every row of `batch` that goes on whatever id it gets
        (`Scheduler.schedule_continuation` picks them), fed with its id from `ids` on the device."""
        nxt = self.scheduler.schedule_continuation(batch.rows)
        if nxt is None:
            return None
        if len(nxt.rows) < len(batch.rows):
            at = {id(r.seq): i for i, r in enumerate(batch.rows)}
            ids = ids[to_device(torch.tensor([at[id(r.seq)] for r in nxt.rows], dtype=torch.long), ids.device)]
        logits = self.cache.run(self.model, nxt, input_ids=ids)
        self.look_ahead_steps += 1
        if any(r.seq.grammar is not None for r in nxt.rows):  # its masks need this step's ids: picked next step
            return _Launched(nxt, pick=lambda: self.sampler.pick_sequences(logits, nxt.seqs))
        return _Launched(nxt, self.sampler.pick_sequences(logits, nxt.seqs))


def default_kv_dtype(model) -> str:
    """The cache storage when none is asked for: FP8 where the model is on a GPU and simulates the reference's FP8
    KV rounding (then the FP8 cache stores the same values in half the bytes, and the decode kernel reads it),
    else the model dtype ("auto": the CPU reference, and `numerics="transformers"`, whose KV is not FP8-rounded)."""
    if next(model.parameters()).device.type != "cuda":
        return "auto"
    return "fp8" if model.numerics.simulate_kv_fp8 else "auto"


def graphs_by_default(model) -> bool:
    """Decode steps run as CUDA graphs unless asked otherwise where they can: a model on a GPU with the Triton
    kernels (the configuration the GPU tests run; eager decode pays a launch per kernel)."""
    return next(model.parameters()).device.type == "cuda" and model.kernels == "triton"


def _retains_prefix(seq: Sequence) -> bool:
    """Whether finished `seq` asked for its cache at an earlier point of its prompt instead of its own."""
    k = seq.params.retain_prefix
    return k is not None and k < seq.num_prompt_tokens


class _Launched:
    """A batch whose ids were picked on the device: their copy to the host is queued at once (pinned memory,
    an event), so reading them later waits for this batch only, not for work launched after it.

    With `pick` instead of ids (rows with a grammar), the pick waits for `ids()`: the grammar's masks need the
    previous step's ids on the host, which the engine reads after launching this batch's forward. The forward
    runs meanwhile; the pick is queued behind it at the start of the next step."""

    def __init__(self, batch: ScheduledBatch, ids: torch.Tensor | None = None, pick=None):
        self.batch, self._pick = batch, pick
        self._ids = self._host = None
        if ids is not None:
            self._start(ids)

    def _start(self, ids: torch.Tensor) -> None:
        self._ids, self._host = ids, HostCopy(ids)

    def ids(self) -> torch.Tensor:
        """The picked ids on the device (picking them now where the pick was deferred)."""
        if self._ids is None:
            self._start(self._pick())
            self._pick = None
        return self._ids

    def read(self) -> list[int]:
        self.ids()
        return self._host.tolist()
