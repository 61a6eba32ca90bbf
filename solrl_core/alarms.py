"""Two alarms a run raises in its metrics (metrics.jsonl ``alarms``, MLflow ``alarms/...``) and log.

* Proxy drift: the explorer ranks the pool, so when its rewards stop agreeing with the full-
  precision ones (the online fidelity: Spearman of the kept seeds' explorer vs regenerated rewards)
  the selection degrades silently. Below ``alarms.drift.threshold`` for ``alarms.drift.window``
  iterations in a row, the run warns and, when configured, switches once to a more faithful
  explorer (more steps, another backend) from the next iteration on.
* Reward hacking: a held-out reward (scored at every evaluation, never trained on) that falls
  while the policy trains means the policy buys the trained reward with something it was not
  asked to give up. A held-out reward warns at an evaluation when it is more than
  ``alarms.hacking.margin`` below its base value (0.03: the aesthetic fall this project accepts
  for a compliance gain; make run's 64-image evaluation moves the aesthetic by about 0.01 either
  way on its own): a fall inside the stated limit is no trade-off to act on. The
  trained rewards' weighted change is recorded beside it and named in the warning whichever way
  it went: a held-out fall beyond the limit is as much a reason to stop when the trained reward
  fell too (a learning rate too high for the policy) as when it rose.

Flags are 0/1 integers, so MLflow charts them. Both alarms are functions of what the metrics
already hold, so a resumed run (and every torchrun rank) reaches the same state.
"""

from __future__ import annotations

import dataclasses
import math

from solrl_core.accounting import backend_precision
from solrl_core.models.adapters import OLD
from solrl_core.quant.explorer import build_explorer


def observe_drift(state, fidelity: float | None) -> dict:
    """Update the run's drift state with one iteration's online fidelity; the metrics record."""
    drift = state.config.alarms.drift
    low = fidelity is not None and math.isfinite(fidelity) and fidelity < drift.threshold
    state.drift_below = state.drift_below + 1 if low else 0
    firing = state.drift_below >= drift.window
    switch = firing and not state.drift_switched and bool(drift.switch_steps or drift.switch_backend)
    if switch:
        switch_explorer(state)
    return {"proxy_drift": int(firing), "drift_below_for": state.drift_below, "drift_switched": int(switch),
            "faithful_explorer": int(state.drift_switched)}


def drift_warning(record: dict, state) -> str | None:
    if not record["proxy_drift"]:
        return None
    drift = state.config.alarms.drift
    what = ("; switched the explorer to " + describe_switch(state.config)) if record["drift_switched"] else ""
    return (f"warning: proxy drift: online fidelity below {drift.threshold} for {record['drift_below_for']} "
            f"iterations (window {drift.window}){what}")


def describe_switch(config) -> str:
    drift = config.alarms.drift
    parts = ([f"{drift.switch_steps} steps"] if drift.switch_steps else []) + \
            ([f"backend {drift.switch_backend}"] if drift.switch_backend else [])
    return ", ".join(parts)


def restore_drift(state, history: list[dict]) -> None:
    """The drift state after the iterations in ``history`` (a resumed run's metrics records)."""
    state.drift_below = 0
    for record in history:
        alarms = record.get("alarms", {})
        state.drift_below = alarms.get("drift_below_for", 0)
        if alarms.get("faithful_explorer") and not state.drift_switched:
            switch_explorer(state)


def switch_explorer(state) -> None:
    """The more faithful explorer from now on: the alarm's step count (stages.explore_steps reads
    it) and/or its backend, built and quantized from the sampling policy, charged at its precision."""
    config = state.config
    state.drift_switched = True
    backend = config.alarms.drift.switch_backend
    if backend:
        state.explorer = build_explorer(state.policy.transformer, backend, config.quant.skip, config.quant.min_dim,
                                        config.quant.fused)
        state.explorer.requantize(state.policy.transformer, adapter=OLD)
        accountant = state.accountant
        accountant.model = dataclasses.replace(accountant.model,
                                               explore_precision=backend_precision(backend, config.accounting.device))


def held_out_rewards(config) -> list[str]:
    """Evaluation rewards the run does not train on."""
    return [name for name in config.eval.rewards if name not in config.rewards]


def check_hacking(config, base: dict[str, float], now: dict[str, float]) -> dict | None:
    """The reward-hacking record of one evaluation against the base one (None: nothing held out).
    ``fall_limit`` records the fall each held-out reward had to pass."""
    hacking = config.alarms.hacking
    held_out = [name for name in held_out_rewards(config) if name in base and name in now]
    if not hacking.enabled or not held_out:
        return None
    trained_change = sum(weight * (now[name] - base[name]) for name, weight in config.rewards.items()
                         if name in base and name in now)
    changes = {name: now[name] - base[name] for name in held_out}
    limits = {name: hacking.margin for name in held_out}
    falling = [name for name, change in changes.items() if change < -limits[name]]
    return {"reward_hacking": int(bool(falling)), "trained_change": trained_change,
            "held_out_change": changes, "fall_limit": limits, "falling": falling}


def hacking_warning(record: dict | None) -> str | None:
    if not record or not record.get("reward_hacking"):
        return None
    limits = record.get("fall_limit", {})
    falls = ", ".join(f"{name} {record['held_out_change'][name]:+.4f}"
                      + (f" (limit {limits[name]:.4f})" if name in limits else "") for name in record["falling"])
    trained = record["trained_change"]
    how = "rose" if trained > 0 else "did not rise"
    return (f"warning: reward hacking: held-out {falls} since the base evaluation, beyond the accepted fall, "
            f"while the trained reward {how} ({trained:+.4f}); look at samples_final.png before training on")
