"""`solrl export`: one of a run's adapters in diffusers' or PEFT's format, with a model card.

The adapters are the ones `solrl sample` draws with (solrl_core.sample.read_run: the newest of
lora.safetensors and the checkpoint, verified against their digests), so an export is the model
the run evaluated. The files are written by diffusers' and peft's own savers
(solrl_core.models.lora_formats); the card (README.md) says what the adapter is and how to load it.
``--push-to-hub REPO`` uploads the folder with huggingface_hub, only when asked.

Bad input (not a run folder, a damaged adapter file, an unknown adapter or format, an --out that
holds files) is a UserError: one line, exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from solrl_core.command_errors import RunFailed, UserError
from solrl_core.export_card import write_card
from solrl_core.ledger import SUMMARY_FILE
from solrl_core.models.registry import model_spec
from solrl_core.output_folder import new_output_directory
from solrl_core.sample import RunAdapters, read_run

FORMATS = ("diffusers", "peft")
ADAPTERS = ("ema", "default")  # what the run evaluates (and `solrl sample` draws by default); what it trains


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a run's output folder (finished, or still running)")
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="diffusers (pytorch_lora_weights.safetensors) or peft (adapter_config.json + "
                             "adapter_model.safetensors)")
    parser.add_argument("--adapter", default="ema", choices=ADAPTERS,
                        help="ema (what the run evaluates, default) or default (the trained adapter)")
    parser.add_argument("--out", required=True, help="a new or empty folder for the files and README.md")
    parser.add_argument("--push-to-hub", metavar="REPO",
                        help="also upload the folder to this Hugging Face repo (private when created; needs "
                             "the network and a token: HF_HUB_OFFLINE=0)")


def command_export(args: argparse.Namespace) -> int:
    run = read_run(_run_path(args.run))
    lora_format = model_spec(run.config.model.loader).lora_format
    if lora_format is None:
        raise UserError(f"model.loader {run.config.model.loader} has no LoRA format to export to")
    tensors = adapter_tensors(run, args.adapter)
    if args.push_to_hub:
        require_online()
    out = new_output_directory(args.out)
    files = write_files(tensors, run, lora_format, args.format, out)
    write_card(out, run, args.adapter, args.format, lora_format, finished_summary(run))
    print(f"{args.adapter} adapter of {run.source.parent} ({run.iterations} iterations) as {args.format}: "
          f"{', '.join(files)} and README.md in {out}")
    if args.push_to_hub:
        print(f"uploaded to https://huggingface.co/{push(out, args.push_to_hub)}")
    return 0


def _run_path(text: str) -> Path:
    try:
        return Path(text).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as error:  # ~nosuchuser, an embedded NUL, a loop
        raise UserError(f"RUN {text!r} is not a usable path ({error})") from None


def adapter_tensors(run: RunAdapters, adapter: str) -> dict:
    """One adapter's tensors, keyed ``<module>.lora_A.weight`` as peft names them without an adapter."""
    prefix = f"{adapter}/"
    tensors = {key.removeprefix(prefix): value for key, value in run.tensors.items() if key.startswith(prefix)}
    if not tensors:
        held = sorted({key.split("/", 1)[0] for key in run.tensors})
        raise UserError(f"{run.source} holds no '{adapter}' adapter (it holds {', '.join(held) or 'none'})")
    return tensors


def write_files(tensors: dict, run: RunAdapters, lora_format, fmt: str, out: Path) -> list[str]:
    # deferred: peft and diffusers at import time (start-up of every solrl command)
    from solrl_core.models.lora_formats import write_diffusers, write_peft

    writer = write_diffusers if fmt == "diffusers" else write_peft
    try:
        return writer(tensors, run.config.train.lora, lora_format, out)
    except (ValueError, KeyError, RuntimeError) as error:  # tensors that do not form the run's adapter
        raise UserError(f"the adapters in {run.source} do not form a LoRA adapter of the run's model "
                        f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); the file is "
                        f"damaged or from another run") from None


def finished_summary(run: RunAdapters) -> dict | None:
    """The run's summary.json when it describes these adapters (a finished run, not extended since)."""
    path = run.source.parent / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("iterations") == run.iterations else None


def require_online() -> None:
    """solrl sets HF_HUB_OFFLINE=1 for every command unless the environment gives it: an upload
    needs it unset or 0, which is said before anything is written."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise UserError("--push-to-hub needs the network, and HF_HUB_OFFLINE is set (solrl sets it to 1 unless "
                        "the environment gives it): run the command with HF_HUB_OFFLINE=0")


def push(out: Path, repo: str) -> str:
    """Upload ``out`` to ``repo`` (created private when it does not exist); returns the repo id."""
    # deferred: huggingface_hub at import time (start-up of every solrl command)
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        url = api.create_repo(repo, private=True, exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=url.repo_id, commit_message="solrl export")
    except Exception as error:  # noqa: BLE001 - network, authentication, a bad name: one line, files kept
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunFailed(f"the export is in {out}, but uploading it to {repo} failed ({first})") from None
    return url.repo_id
