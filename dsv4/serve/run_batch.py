"""`dsv4 run-batch -i requests.jsonl -o results.jsonl`: a file of requests in OpenAI's Batch API format, served
at full throughput without a server.

Each input line is `{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions" | "/v1/completions" |
"/v1/responses", "body": {...}}`. The requests go to the server's own app in this process (through httpx's ASGI
transport, no socket), all of them at once, so continuous batching sees the whole file and every request is checked
and answered exactly as `dsv4 serve` would. Each output line, in input order, is OpenAI's batch result:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`; a request the server
refuses keeps its 4xx status and error body there. The file is checked before the model loads (a bad line is an
error naming it, and nothing runs). Answers are appended to `OUT.partial` as they come; the same command run again
after an interruption (or an engine failure, 5xx) goes on from them. `OUT` is written whole, in input order, once
every request has an answer (a temporary file renamed), and `OUT.partial` is removed. With `--tp` / `--ep` rank 0
answers the file, the other ranks follow.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

from .cli_serve import add_engine_arguments, build_core, check_engine_arguments

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--input", required=True, metavar="FILE", help="requests, one JSON object per line")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="results, one JSON object per line")
    add_engine_arguments(p)


def read_requests(path: Path) -> list[dict]:
    """The file's requests, checked (ValueError naming the line for the first bad one)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    requests, seen = [], set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(req, dict):
            raise ValueError(f"{where}: expected a JSON object")
        cid = req.get("custom_id")
        if not isinstance(cid, str) or not cid:
            raise ValueError(f"{where}: custom_id must be a non-empty string")
        if cid in seen:
            raise ValueError(f"{where}: custom_id {cid!r} is used twice")
        seen.add(cid)
        if req.get("method", "POST") != "POST":
            raise ValueError(f"{where}: method must be POST")
        if req.get("url") not in ROUTES:
            raise ValueError(f"{where}: url must be one of {', '.join(ROUTES)}, got {req.get('url')!r}")
        if not isinstance(req.get("body"), dict):
            raise ValueError(f"{where}: body must be a JSON object")
        if req["body"].get("stream"):
            raise ValueError(f"{where}: stream is not supported in a batch")
        requests.append(req)
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests


def result_line(req: dict, status: int, body: object) -> dict:
    request_id = body.get("id") if isinstance(body, dict) else None
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": req["custom_id"],
            "response": {"status_code": status, "request_id": request_id or "", "body": body}, "error": None}


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def read_partial(path: Path, requests: list[dict]) -> dict[str, dict]:
    """Results an interrupted run kept (by custom_id), those of this file's requests that need no new try: answered
    or refused (4xx); a 5xx (the engine failed) is tried again. A torn last line is ignored."""
    if not path.is_file():
        return {}
    ids, kept = {r["custom_id"] for r in requests}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            result = json.loads(line)
            if result["custom_id"] in ids and result["response"]["status_code"] < 500:
                kept[result["custom_id"]] = result
        except (ValueError, KeyError, TypeError):
            continue
    return kept


async def _send_all(app, requests: list[dict], partial, progress) -> None:
    """Answer every request, each result appended to `partial` (a file) as it comes."""
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dsv4",
                                 timeout=None) as client:
        async def one(req: dict) -> None:
            r = await client.post(req["url"], json=req["body"])
            try:
                body = r.json()
            except ValueError:
                body = {"error": {"message": r.text, "type": "server_error", "param": None, "code": r.status_code}}
            partial.write(json.dumps(result_line(req, r.status_code, body), ensure_ascii=False) + "\n")
            partial.flush()
            progress.update(1)

        await asyncio.gather(*(one(req) for req in requests))


def check(args: argparse.Namespace) -> list[dict]:
    """The engine options and the input file, checked before any model loads; the requests."""
    check_engine_arguments(args)
    requests = read_requests(Path(args.input))
    if not Path(args.output).parent.is_dir():
        raise ValueError(f"--output {args.output}: directory {Path(args.output).parent} does not exist")
    return requests


def answer(core, args: argparse.Namespace, requests: list[dict], model_name: str) -> int:
    """Send `requests` to an app around engine core `core` (LLMEngine, or rank 0's DistributedEngine); write the
    results."""
    from tqdm import tqdm

    from ..engine.async_engine import AsyncEngine
    from .app import ServerConfig, create_app
    from .chat_bridge import ChatBridge

    # every request is admitted at once (no 429s): the scheduler runs max_num_seqs of them, the rest wait
    engine = AsyncEngine(core, max_running=args.max_num_seqs, max_queued=1 << 40)
    bridge = ChatBridge(getattr(core, "tokenizer", None), core.vocab_size, default_thinking=args.default_thinking)
    names = args.served_model_name or [model_name]
    cfg = ServerConfig(model_name=names[0], model_aliases=tuple(names[1:]), max_model_len=core.max_model_len,
                       max_body_bytes=1 << 62, responses_store=0)
    app = create_app(engine, bridge, cfg)
    out = Path(args.output)
    partial = partial_path(out)
    done = read_partial(partial, requests)
    todo = [r for r in requests if r["custom_id"] not in done]
    if done:
        print(f"dsv4 run-batch: resuming: {len(done)} of {len(requests)} requests were answered before "
              f"({partial})", file=sys.stderr)
    if partial.is_file() and partial.stat().st_size:
        with open(partial, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")  # (a line torn by the interruption stays alone and is ignored)
    engine.start()
    try:
        with open(partial, "a", encoding="utf-8") as f, \
                tqdm(total=len(requests), initial=len(done), desc="requests", unit="req", file=sys.stderr) as bar:
            asyncio.run(_send_all(app, todo, f, bar))
    except BaseException:
        print(f"dsv4 run-batch: stopped; the answers so far are in {partial}: the same command goes on from them",
              file=sys.stderr)
        raise
    finally:
        engine.shutdown()
    got = read_partial(partial, requests)
    missing = [r["custom_id"] for r in requests if r["custom_id"] not in got]
    if missing:  # 5xx: the engine failed; keep what was answered for the next run
        raise ValueError(f"{len(missing)} requests failed in the engine (e.g. {missing[0]!r}); the answers so far "
                         f"are in {partial}: the same command goes on from them")
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for req in requests:
            f.write(json.dumps(got[req["custom_id"]], ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    partial.unlink()
    failed = sum(1 for r in got.values() if r["response"]["status_code"] != 200)
    print(f"dsv4 run-batch: {len(requests)} requests, {len(requests) - failed} answered, {failed} refused "
          f"-> {out}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    requests = check(args)  # before the (slow) model load
    core = build_core(args)
    return answer(core, args, requests, core.model_name)
