"""Processes: join a torchrun-style environment, or start the ranks ourselves.

`torchrun --nproc-per-node N -m dsv4 ...` sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT; `init_from_env` joins that group (NCCL with one GPU per rank when CUDA is present, gloo
on CPU) and builds the TP/EP groups. `dsv4 ... --tp N --ep M` without torchrun calls `spawn_ranks`,
which starts max(N, M) copies of the same command line with that environment on this host; only
rank 0's stdout is kept (it alone prints and serves HTTP), every rank's stderr is.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from dsv4.distributed.parallel_state import ParallelConfig, ParallelState, init_parallel

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_launcher() -> bool:
    """True inside a process started by torchrun or spawn_ranks."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def resolve_sizes(tp: int | None, ep: int | None, world: int | None = None) -> tuple[int, int]:
    """--tp/--ep as given; neither given under a launcher of W processes: tp = ep = W."""
    if tp is None and ep is None and world is not None:
        return world, world
    return tp or 1, ep or 1


def init_from_env(tp: int | None = None, ep: int | None = None, moe_comm: str = "allreduce",
                  device: str | None = None) -> ParallelState:
    """Initialise torch.distributed from the launcher's environment and build the TP/EP groups."""
    if not under_launcher():
        raise ValueError("init_from_env: RANK/WORLD_SIZE are not set (start with torchrun or --tp/--ep)")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    tp, ep = resolve_sizes(tp, ep, world)
    config = ParallelConfig(tp, ep, moe_comm)
    use_cuda = torch.cuda.is_available() and (device is None or device in ("auto", "cuda"))
    if use_cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        if use_cuda:
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device(f"cuda:{local}"))
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world)
    return init_parallel(config, f"cuda:{local}" if use_cuda else "cpu")


def run_ranks(fn, args, world: int) -> None:
    """Run `fn(rank, args)` on every rank: this process's rank under torchrun, else `world` local ranks."""
    if under_launcher():
        fn(int(os.environ["RANK"]), args)
        return
    os.environ.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.multiprocessing.spawn(fn, args=(args,), nprocs=world)


def spawn_ranks(argv: list[str], world: int, module: str = "dsv4") -> int:
    """Run `python -m <module> argv` as `world` ranks on this host; return the first failing exit
    status (or 0). SIGINT/SIGTERM go to rank 0, which releases the other ranks when it stops."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = None if rank == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=env, stdout=out))

    def forward(sig, _frame):
        if procs[0].poll() is None:
            procs[0].send_signal(sig)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = 0
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:  # a rank died: the others would wait for it forever
                status = failed[0]
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                break
            time.sleep(0.2)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        status = status or next((p.returncode for p in procs if p.returncode), 0)
        return 128 - status if status < 0 else status  # killed by signal N -> 128 + N, like a shell
    finally:
        for s, h in old.items():
            signal.signal(s, h)
