"""Several processes for one model: tensor parallel attention/vocab/shared expert, expert parallel
routed experts (docs/parallel.md). `parallel_state` (groups), `sharding` (who holds what),
`moe_comm` (dispatch/combine), `engine` (rank 0 drives, the others follow), `launcher` (processes)."""
from dsv4.distributed.parallel_state import (
    ParallelConfig, ParallelState, destroy_parallel, get_parallel_state, init_parallel,
)
from dsv4.distributed.sharding import Layout

__all__ = ["ParallelConfig", "ParallelState", "Layout", "init_parallel", "get_parallel_state",
           "destroy_parallel"]
