"""benchmarks/update_rerun.py: rewards at equal iterations read off each run's own evaluations,
and the before/after table of a study's families."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.update_rerun import before_after, equal_iterations, reward_after  # noqa: E402


def _curve(every: int, rewards: list[float]) -> list[dict]:
    """A run's evaluations: the base (iteration -1), then one after every ``every`` iterations."""
    return [{"iteration": i * every - 1, "reward": reward, "modeled_gpu_hours": float(i)}
            for i, reward in enumerate(rewards)]


def _family(runs: list[list[dict]]) -> dict:
    finals = [curve[-1]["reward"] for curve in runs]
    mean = [sum(c[i]["reward"] for c in runs) / len(runs) for i in range(len(runs[0]))]
    curve = [{**point, "reward": mean[i]} for i, point in enumerate(runs[0])]
    return {"curve": curve, "runs": [{"seed": s, "final_reward": f, "curve": c}
                                     for s, (f, c) in enumerate(zip(finals, runs))]}


def test_a_reward_between_two_evaluations_is_read_on_the_line_between_them():
    curve = _curve(4, [0.3, 0.5, 0.6])
    assert reward_after(curve, 0) == pytest.approx(0.3)
    assert reward_after(curve, 2) == pytest.approx(0.4)
    assert reward_after(curve, 8) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="iteration 9"):
        reward_after(curve, 9)


def test_equal_iterations_compare_families_whatever_their_evaluation_spacing():
    """A cheap family evaluated every 8 iterations and a dear one every 4 are read at the same
    iteration counts, up to the shortest run, and a pair's difference is taken there."""
    cheap = _family([_curve(8, [0.3, 0.4, 0.5, 0.55]), _curve(8, [0.3, 0.42, 0.52, 0.56])])
    dear = _family([_curve(4, [0.3, 0.4, 0.45, 0.5, 0.5]), _curve(4, [0.3, 0.38, 0.43, 0.48, 0.5])])
    result = equal_iterations({"families": {"cheap": cheap, "dear": dear}}, [("dear", "cheap")])
    assert result["grid"] == [0, 8, 16]
    after_8 = {name: points[1]["mean"] for name, points in result["families"].items()}
    assert after_8 == pytest.approx({"cheap": 0.41, "dear": 0.44})
    difference = result["differences"]["dear - cheap"]
    assert [point["iterations"] for point in difference] == [8, 16]
    assert difference[0]["mean"] == pytest.approx(0.03)


def test_before_after_gives_each_familys_final_and_the_peak_of_its_mean_curve():
    old = _family([_curve(4, [0.3, 0.5, 0.45]), _curve(4, [0.3, 0.48, 0.43])])
    new = _family([_curve(4, [0.3, 0.45, 0.5]), _curve(4, [0.3, 0.47, 0.52])])
    rows = before_after({"families": {"sol_rl": old}, "budget_gpu_hours": 1.0},
                        {"families": {"sol_rl": new, "random_pool": new}, "budget_gpu_hours": 1.0})
    assert rows["sol_rl"]["before"]["final"] == pytest.approx(0.44)
    assert rows["sol_rl"]["before"]["peak"]["iteration"] == 3 and rows["sol_rl"]["after"]["peak"]["iteration"] == 7
    assert rows["sol_rl"]["after"]["final"] == pytest.approx(0.51)
    assert "before" not in rows["random_pool"]  # a family new to the study has no before
