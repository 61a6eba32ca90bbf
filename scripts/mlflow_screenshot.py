"""The README's MLflow screenshot: one run's evaluation charts against modeled GPU-hours.

Opens the run's *Model metrics* tab in the MLflow UI in headless Chromium, filters the charts to
``eval/``, sets each chart's X-axis to the metric ``modeled_gpu_hours_cumulative`` (the chart's
*Configure* dialog, as a user would) and saves the page as a PNG. The UI must already be serving
the run's store, e.g. ``make mlflow-ui``.

It needs what the project does not install: Playwright (``pip install playwright`` in any
environment) and a Chromium binary (Debian's ``chromium`` package, /usr/bin/chromium); Playwright's
own browser download needs a network this host does not have.

    python scripts/mlflow_screenshot.py --run RUN_ID --out reports/mlflow_metrics_vs_modeled_gpu_hours.png
    python scripts/mlflow_screenshot.py --experiment ID --group-by solrl.variant --out reports/mlflow_study.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

X_METRIC = "modeled_gpu_hours_cumulative"
# Chromium as a headless client of a loopback page on a host without a network: no background
# connections, which the closed network would refuse at every start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
CHART_MENU = "[data-testid='experiment-view-compare-runs-card-menu']"
SETTLE_MS = 1500  # the UI animates dialogs and re-draws charts after each change


def screenshot(ui: str, experiment: str, run: str | None, out: Path, chromium: str, charts: int,
               group_by: str | None = None) -> None:
    """One run's *Model metrics* tab, or (``run`` None) the experiment's chart view of all its runs,
    grouped by the tag ``group_by`` when given: the eval/ charts against modeled GPU-hours."""
    from playwright.sync_api import sync_playwright  # deferred: optional package playwright

    base = f"{ui.rstrip('/')}/#/experiments/{experiment}"
    url = f"{base}/runs/{run}/model-metrics" if run else f"{base}?workflowType=machine_learning"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 900})
        _open_in_training_view(page, url)
        if run is None:
            page.locator("input[type=radio][value=CHART]").evaluate("radio => radio.click()")  # the chart view
            page.wait_for_timeout(2 * SETTLE_MS)
            if group_by:
                _group_runs_by_tag(page, group_by)
        page.get_by_placeholder("Search metric charts").fill("eval/")
        page.wait_for_timeout(2 * SETTLE_MS)
        for index in range(charts):
            _x_axis_to_gpu_hours(page, index)
        page.set_viewport_size({"width": 1500, "height": 620 if run else 760})
        page.wait_for_timeout(2 * SETTLE_MS)
        page.mouse.move(1400, 600)  # no hover tooltip over a chart
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial.png")
        page.screenshot(path=str(partial))
        partial.replace(out)
        browser.close()


def _open_in_training_view(page, url: str) -> None:
    page.goto(url)
    page.wait_for_timeout(3 * SETTLE_MS)
    # MLflow 3 opens on its GenAI view; the switch to model training lands on the runs list.
    page.get_by_text("Model training", exact=True).first.click()
    page.goto(url)
    page.wait_for_timeout(3 * SETTLE_MS)
    assistant = page.locator("button[aria-label='Close']")
    if assistant.count():
        assistant.first.click()


def _group_runs_by_tag(page, tag: str) -> None:
    """The runs table's *Group by* menu: one line per tag value (a family), its seeds aggregated."""
    page.get_by_role("button", name="Group by").click()
    page.wait_for_timeout(SETTLE_MS)
    page.keyboard.type(tag)
    page.wait_for_timeout(SETTLE_MS)
    page.get_by_role("menuitemcheckbox", name=tag).first.click()
    page.keyboard.press("Escape")
    page.wait_for_timeout(2 * SETTLE_MS)


def _x_axis_to_gpu_hours(page, index: int) -> None:
    """Chart ``index``'s *Configure* dialog: X-axis the metric modeled_gpu_hours_cumulative."""
    page.locator(CHART_MENU).nth(index).click()
    page.get_by_text("Configure", exact=True).click()
    page.wait_for_timeout(SETTLE_MS)
    page.get_by_role("radio", name="Metric").check(force=True)
    page.get_by_text("Select metric", exact=True).click(force=True)
    page.keyboard.type(X_METRIC)
    page.wait_for_timeout(SETTLE_MS // 2)
    page.keyboard.press("Enter")
    page.get_by_text("Save changes", exact=True).click()
    page.wait_for_timeout(SETTLE_MS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ui", default="http://127.0.0.1:5000", help="MLflow UI address (default: make mlflow-ui's)")
    parser.add_argument("--experiment", default="1", help="experiment id (default 1: the first one a store creates)")
    parser.add_argument("--run", default=None, help="run id (default: the experiment's runs together, its chart view)")
    parser.add_argument("--group-by", default=None, help="with no --run: group the runs by this tag (e.g. solrl.variant)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--charts", type=int, default=2, help="eval/ charts to configure (default 2)")
    args = parser.parse_args(argv)
    try:
        import playwright  # noqa: F401  # deferred: optional package playwright
    except ImportError:
        print("mlflow_screenshot: Playwright is not installed here; `pip install playwright` "
              "(and Debian's chromium for --chromium)", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"mlflow_screenshot: no Chromium at {args.chromium}; install Debian's chromium or pass --chromium",
              file=sys.stderr)
        return 2
    screenshot(args.ui, args.experiment, args.run, args.out, args.chromium, args.charts, args.group_by)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
