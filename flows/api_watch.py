"""A run that loses its Prefect API server mid-run (the ephemeral server's process died, the
server of ``PREFECT_API_URL`` went away) goes on without it, with one warning line.

Prefect 3 runs a flow's tasks on the client side (their states travel to the server as events),
so the stages themselves never wait for the server; what does is everything around them: the
events worker retries each unsent event for about 7 s, the log worker prints a traceback per
failed batch, and the flow run's closing state is proposed with the client's retries. Left alone,
a run whose server died finished its training and then failed, minutes later, on that closing
report.

So the stage runner asks the API's ``/health`` before every stage (one plain request, no retries,
a bounded timeout). The first time it gets no answer, :class:`ApiWatch` prints the warning,
detaches the run from Prefect (no more log shipping, the delivery failures kept off the
terminal) and the runner calls the remaining stages directly. When the training is done, the
flow engine's closing report fails against the lost server; ``run_locally`` then returns the
summary the flow body left with the watch, so the run ends as it would have: exit 0, its usual
summary. A server lost after the last stage asked (only the closing report fails) ends the same
way, the warning then given by ``closing_report_failed``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

HEALTH_TIMEOUT_S = 10.0  # a server that takes longer to say it is healthy is taken as lost
# Prefect's loggers that report deliveries to a lost server failing (one line per event, per
# log batch, per reconnection): the warning line has said it once.
DELIVERY_LOGGERS = ("prefect._internal.concurrency", "prefect.events.clients", "EventsWorker", "APILogWorker")

_current: ApiWatch | None = None  # this process's flow run's watch (one flow run at a time)


class ApiWatch:
    """Whether this flow run's API still answers; ``lost`` once it did not."""

    def __init__(self, api_url: str | None, out_dir: Path, flow_run_name: str | None):
        self.health = f"{api_url.rstrip('/')}/health" if api_url else None
        self.out_dir, self.flow_run_name = out_dir, flow_run_name
        self.lost = False
        self.summary: dict | None = None  # the flow body's, once it has returned
        self._http = None

    @classmethod
    def for_this_flow_run(cls, out_dir: Path) -> ApiWatch:
        from prefect.context import FlowRunContext

        global _current
        context = FlowRunContext.get()
        client = getattr(context, "client", None)
        api_url = str(client.api_url) if client is not None else None
        name = context.flow_run.name if context is not None and context.flow_run is not None else None
        _current = cls(api_url, out_dir, name)
        return _current

    def answers(self, stage: str) -> bool:
        """True while the API answers; the first time it does not, warn and detach (once)."""
        if self.lost or self.health is None:
            return not self.lost
        import httpx

        if self._http is None:
            self._http = httpx.Client(timeout=HEALTH_TIMEOUT_S)
        try:
            self._http.get(self.health).raise_for_status()
            return True
        except httpx.HTTPError as error:
            self._lose(f"before stage '{stage}'", error)
            return False

    def _lose(self, where: str, error: BaseException) -> None:
        self.lost = True
        if self._http is not None:
            self._http.close()
        detach_from_api()
        flow_run = f" (flow run '{self.flow_run_name}' keeps the states reported before)" if self.flow_run_name else ""
        cause = f"{type(error).__name__}: {error}".splitlines()[0]
        api = self.health.removesuffix("/health") if self.health else "the Prefect API"
        print(f"solrl: warning: lost the Prefect API at {api} {where} ({cause}); the run goes on without "
              f"orchestration{flow_run}, and {self.out_dir} keeps its whole record", file=sys.stderr, flush=True)

    def finished(self, summary: dict) -> None:
        """The flow body returned ``summary``: the run's work is done, whatever the engine's
        closing report to the server does next."""
        self.summary = summary

    def closing_report_failed(self, error: BaseException) -> dict:
        """The engine could not report the finished flow run (the server went away after the last
        stage asked, or was lost before): the summary, after one warning if none was given."""
        if not self.lost:
            self._lose("as the flow run reported its end", error)
        return self.summary


def finished_flow_run() -> ApiWatch | None:
    """The watch of this process's flow run if its body has returned (its work done), else None."""
    return _current if _current is not None and _current.summary is not None else None


def forget() -> None:
    """The flow run is over (its outcome handed on): the next one starts a watch of its own."""
    global _current
    _current = None


def detach_from_api() -> None:
    """No more log records to the lost server, and its delivery failures off the terminal."""
    from prefect.logging.handlers import APILogHandler

    loggers = [logging.getLogger()] + [logger for logger in logging.root.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in [h for h in logger.handlers if isinstance(h, APILogHandler)]:
            logger.removeHandler(handler)
    for name in DELIVERY_LOGGERS:  # disabled, not a level: Prefect's internal loggers ignore levels
        logging.getLogger(name).disabled = True
    # Prefect's log worker writes each failed batch's traceback to stderr unless the standard
    # library's logging errors are off (logs queued just before the loss still fail).
    logging.raiseExceptions = False
