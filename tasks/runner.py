"""The stage runner the Prefect flow hands to ``solrl_core.training.run_training``: each stage the
loop calls runs as its Prefect task, and leaves one log line (stage, seconds)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prefect.utilities.annotations import opaque

from tasks.stages import STAGE_TASKS


class PrefectStageRunner:
    """``runner(stage, function, *args)`` -> the stage's task, called in this process.

    Arguments are wrapped in ``opaque`` so Prefect resolves them without walking into the run
    state (models, tensors) looking for upstream futures.

    ``api`` (a flows.api_watch.ApiWatch) is asked before each stage whether the Prefect API still
    answers; once it does not, the stages run as their plain functions (the run goes on without
    orchestration instead of failing on the lost server).
    """

    def __init__(self, log: Callable[[str], None] = print, api=None):
        self.log, self.api = log, api
        self._without_retries: dict[str, object] = {}

    def __call__(self, stage: str, function: Callable, *args, **kwargs):
        task = STAGE_TASKS.get(stage)
        if task is None:  # a step the loop added that has no task of its own yet
            return function(*args, **kwargs)
        if task.fn is not function:
            raise TypeError(f"stage '{stage}' calls {function.__qualname__}, but its task wraps {task.fn.__qualname__}")
        started = time.perf_counter()
        if self.api is None or self.api.answers(stage):
            task = self._collective_safe(task)
            result = task(*(opaque(a) for a in args), **{k: opaque(v) for k, v in kwargs.items()})
        else:
            result = function(*args, **kwargs)
        self.log(f"{stage:<10} {time.perf_counter() - started:7.2f} s")
        return result


    def _collective_safe(self, task):
        """Under torchrun a retry on rank 0 alone would pair its collectives with the wrong calls of
        the other ranks: no retries there (a failed stage fails the run; resume continues it)."""
        from solrl_core.distributed import current

        if not current().distributed or not task.retries:
            return task
        if task.name not in self._without_retries:
            self._without_retries[task.name] = task.with_options(retries=0)
        return self._without_retries[task.name]


def quiet_task_logs() -> None:
    """Prefect logs 'Finished in state Completed()' for every task run; the runner already says
    one line per stage, so only task warnings and failures get through."""
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
