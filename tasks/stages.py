"""One Prefect task per Sol-RL stage, each the plain function of ``solrl_core.stages``.

The tasks run in the flow's process and hand the run state (models, optimizer) to each other in
memory: no task result is persisted and nothing is hashed (``NO_CACHE``), so Prefect never
serialises a model or a latent. Only stages that read the state without changing it retry
(a transient device or reward-model failure); ``update``, ``quantize`` and ``requantize`` change
the weights or the explorer and never run twice.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from solrl_core import stages

_IN_MEMORY = {"cache_policy": NO_CACHE, "persist_result": False, "log_prints": False}
_RETRY_ONCE = {"retries": 1, "retry_delay_seconds": 2}

load = task(stages.initial_state, name="load", **_IN_MEMORY)
quantize = task(stages.quantize, name="quantize", **_IN_MEMORY)
explore = task(stages.explore, name="explore", **_IN_MEMORY, **_RETRY_ONCE)
rank = task(stages.rank, name="rank", **_IN_MEMORY, **_RETRY_ONCE)
regenerate = task(stages.regenerate, name="regenerate", **_IN_MEMORY, **_RETRY_ONCE)
update = task(stages.update, name="update", **_IN_MEMORY)
requantize = task(stages.requantize, name="requantize", **_IN_MEMORY)
evaluate = task(stages.evaluate, name="evaluate", **_IN_MEMORY, **_RETRY_ONCE)

# Stage name (as the training loop calls it) -> its task.
STAGE_TASKS = {t.name: t for t in (load, quantize, explore, rank, regenerate, update, requantize, evaluate)}
