"""`solrl sample`: images from a run's adapters, for the user's prompts and seeds.

A run folder holds its adapters twice over: ``lora.safetensors`` (written when the run finishes,
beside summary.json) and the resumable ``checkpoint.safetensors`` (after every checkpointed
iteration, so also while the run is still going). The one further into the run is read (a finished
run that was resumed and extended has an older lora.safetensors), with the config it records, so
the images come from the run's own model, sampler, shift and evaluation steps.
Sampling goes through the evaluation stage's own loop (stages._sample_seeds): an image here is
the one the run's evaluation would draw for that prompt and noise seed.

Bad input (no run folder, damaged adapters, no prompts, bad seeds) is a UserError: one line,
exit code 2, before any model is loaded where it can be told that early.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from solrl_core.checkpoint import _ADAPTERS as CHECKPOINT_ADAPTERS  # the checkpoint's key prefix of the adapters
from solrl_core.checkpoint import CHECKPOINT, CheckpointError, load_verified, one_line_error, read_metadata
from solrl_core.cli_syntax import add_list_argument
from solrl_core.command_errors import UserError
from solrl_core.compare import _pyplot, _wrap  # the reports' sample grids draw the same way
from solrl_core.config import MAX_COUNT, Config, ConfigError, from_dict
from solrl_core.ledger import LORA_FILE, SUMMARY_FILE
from solrl_core.prompts import read_prompt_file

ADAPTERS = ("ema", "trained", "base")  # --adapter: what the run evaluates, what it trains, no adapter
DEFAULT_SEEDS = "0,1,2,3"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a run's output folder (finished, or still running)")
    parser.add_argument("--prompt", action=_Repeated, default=(), help="a prompt (repeat for more)")
    parser.add_argument("--prompt-file", help="a text file, one prompt per line (after any --prompt)")
    add_list_argument(parser, "--seeds", "0,1,2", default=DEFAULT_SEEDS,
                      help=f"noise seeds, comma list (default {DEFAULT_SEEDS})")
    parser.add_argument("--adapter", default="ema", choices=ADAPTERS,
                        help="ema (what the run evaluates, default), trained, or base (no adapter)")
    parser.add_argument("--out", help="folder for the PNG files, grid-ADAPTER.png and samples-ADAPTER.json "
                                      "(default RUN/samples)")


class _Repeated(argparse.Action):
    """A repeatable option collected as a tuple: the CLI refuses list values, which is how argparse
    (3.11) reads ``--opt=--`` (solrl_core.cli_studies.one_value_each)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (*getattr(namespace, self.dest), values))


@dataclass(frozen=True)
class RunAdapters:
    config: Config
    tensors: dict[str, torch.Tensor]  # "ema/<module>.lora_A.weight" and the like, as adapter_state writes
    source: Path
    iterations: int  # iterations the adapters have trained


def command_sample(args: argparse.Namespace) -> int:
    prompts, seeds = requested_prompts(args), parse_seeds(args.seeds)
    run = read_run(_path(args.run, "RUN"))
    out = _path(args.out, "--out") if args.out else run.source.parent / "samples"
    images = draw(run, prompts, seeds, args.adapter)
    files = write_images(out, images, prompts, seeds, args.adapter)
    grid = write_grid(out / f"grid-{args.adapter}.png", images, prompts, seeds, caption(run, args.adapter))
    write_index(out, run, args.adapter, prompts, seeds, files, grid)
    print(f"{len(files)} images ({caption(run, args.adapter)}) in {out}; grid {grid}")
    return 0


# ---------------------------------------------------------------------------------------------
# Input


def requested_prompts(args: argparse.Namespace) -> list[str]:
    prompts = [prompt.strip() if isinstance(prompt, str) else "" for prompt in args.prompt]
    if any(not prompt for prompt in prompts):
        raise UserError("--prompt needs a value: the text of a prompt")
    if args.prompt_file:
        prompts += read_prompt_file(args.prompt_file, "--prompt-file")
    if not prompts:
        raise UserError("no prompts: give --prompt TEXT (repeatable) or --prompt-file FILE")
    return prompts


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or any(not 0 <= seed <= MAX_COUNT for seed in seeds):
        raise UserError(f"--seeds {text!r}: expected one or more integers from 0 to {MAX_COUNT}, e.g. 0,1,2")
    return list(dict.fromkeys(seeds))  # a seed twice draws the same image twice


def _path(text: str, what: str) -> Path:
    try:
        return Path(text).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as error:  # ~nosuchuser, an embedded NUL, a loop
        raise UserError(f"{what} {text!r} is not a usable path ({error})") from None


def read_run(run_dir: Path) -> RunAdapters:
    """The newest adapters in ``run_dir`` and the config they were trained with."""
    if not run_dir.is_dir():
        raise UserError(f"no run folder at {run_dir}; give the --out of a `solrl run`")
    finished = _finished_run(run_dir)
    running = _running_run(run_dir) if (run_dir / CHECKPOINT).is_file() else None
    # A finished run checkpoints its last iteration too; a checkpoint ahead of summary.json is a
    # finished run that was resumed and extended, whose lora.safetensors is older.
    newest = max((run for run in (finished, running) if run is not None), key=lambda run: run.iterations,
                 default=None)
    if newest is None:
        raise UserError(f"{run_dir} holds no {LORA_FILE} with {SUMMARY_FILE} nor a {CHECKPOINT}: not a run's "
                        "output folder, or a run stopped before its first checkpoint")
    return newest


def _finished_run(run_dir: Path) -> RunAdapters | None:
    lora, summary = run_dir / LORA_FILE, run_dir / SUMMARY_FILE
    if not (lora.is_file() and summary.is_file()):
        return None
    try:
        record = json.loads(summary.read_text(encoding="utf-8"))
        config, iterations = record["config"], int(record["iterations"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{summary} is damaged ({type(error).__name__}: {error}); it holds the run's config") from None
    return RunAdapters(_run_config(config, summary), _read_tensors(lora, prefix=""), lora, iterations)


def _running_run(run_dir: Path) -> RunAdapters:
    path = run_dir / CHECKPOINT
    try:
        metadata = read_metadata(run_dir)
    except CheckpointError as error:
        raise UserError(str(error).replace("cannot resume", "cannot sample")) from None
    return RunAdapters(_run_config(metadata["config"], path), _read_tensors(path, CHECKPOINT_ADAPTERS), path,
                       int(metadata["next_iteration"]))


def _run_config(mapping: dict, where: Path) -> Config:
    from solrl_core.presets import validate  # deferred: the registries, at import time

    try:
        return validate(from_dict(mapping))
    except (ConfigError, TypeError, AttributeError) as error:
        raise UserError(f"the config recorded in {where} is not usable ({error})") from None


def _read_tensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The adapter tensors of a safetensors file, keys with ``prefix`` removed, after the file's
    recorded digest is checked (a damaged file is named, never sampled from)."""
    try:
        every, _ = load_verified(path, "adapter file")
    except CheckpointError as error:
        raise UserError(f"{error}; use another run, or resume this one to write them again") from None
    tensors = {key.removeprefix(prefix): tensor for key, tensor in every.items() if key.startswith(prefix)}
    if not tensors:
        raise UserError(f"{path} holds no adapters")
    return tensors


# ---------------------------------------------------------------------------------------------
# Sampling


def draw(run: RunAdapters, prompts: list[str], seeds: list[int], adapter: str) -> torch.Tensor:
    """Images [prompts x seeds, 3, H, W] in [0, 1], prompt-major: one per (prompt, seed), drawn
    with ``adapter`` (one of ADAPTERS) active."""
    from solrl_core import stages  # deferred: diffusers and peft, at import time
    from solrl_core.models.adapters import EMA, TRAINED
    from solrl_core.models.loading import ModelFilesMissing
    from solrl_core.models.registry import load_policy

    config = run.config
    try:
        policy = load_policy(config)
    except ModelFilesMissing as missing:
        raise UserError(str(missing)) from None
    load_adapters(policy, run)
    # The evaluation loop reads only the state's config and policy: no rewards or optimizer are built.
    state = stages.RunState(config=config, policy=policy, rewards=None, optimizer=None, train_prompts=[],
                            eval_prompts=prompts)
    pairs = [(prompt, seed) for prompt in prompts for seed in seeds]
    active = {"ema": EMA, "trained": TRAINED, "base": None}[adapter]  # None: adapters off
    latents, _ = stages._sample_seeds(state, [p for p, _ in pairs], [s for _, s in pairs], config.eval.steps,
                                      config.eval.chunk, adapter=active, explorer=None, label="sample")
    return policy.decode(latents.to(policy.device)).cpu()


def load_adapters(policy, run: RunAdapters) -> None:
    """Attach the run's three adapters to ``policy`` with the run's rank, alpha and targets, and load the
    run's weights into them (what `solrl sample` draws with; the export tests compare against it)."""
    from solrl_core.models.adapters import attach_adapters, load_adapter_state  # deferred: peft, at import time

    lora = run.config.train.lora
    attach_adapters(policy.transformer, lora.rank, lora.alpha, lora.targets, seed=run.config.seed)
    try:
        load_adapter_state(policy.transformer, run.tensors)
    except (KeyError, RuntimeError) as error:  # a missing adapter tensor, or one of another shape
        raise UserError(f"the adapters in {run.source} do not fit the run's model ({one_line_error(error)}); "
                        "the file is damaged or from another run") from None


# ---------------------------------------------------------------------------------------------
# Output


def image_name(adapter: str, prompt_index: int, seed: int) -> str:
    return f"{adapter}-p{prompt_index:03d}-s{seed}.png"


def write_images(out: Path, images: torch.Tensor, prompts: list[str], seeds: list[int], adapter: str) -> list[str]:
    from torchvision.utils import save_image  # deferred: torchvision, at import time

    _writable(out)
    names = []
    for index, image in enumerate(images):
        prompt_index, seed = divmod(index, len(seeds))
        names.append(image_name(adapter, prompt_index, seeds[seed]))
        save_image(image, str(out / names[-1]))
    return names


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot write to {out}: {error.strerror or error}; choose another --out") from None


def caption(run: RunAdapters, adapter: str) -> str:
    config = run.config
    trained = f"after {run.iterations} iteration{'s' if run.iterations != 1 else ''} ({run.source.name})"
    what = "base model, no adapter" if adapter == "base" else f"{adapter} adapter {trained}"
    return f"{config.preset} / {config.family}: {what}; {config.sampler.kind} sampler, {config.eval.steps} steps"


def write_grid(path: Path, images: torch.Tensor, prompts: list[str], seeds: list[int], title: str) -> Path:
    """A row per prompt (captioned with it), a column per seed."""
    plt = _pyplot()
    rows, columns = len(prompts), len(seeds)
    figure, axes = plt.subplots(rows, columns, figsize=(1.8 * columns + 2.6, 1.8 * rows + 0.6), squeeze=False)
    for index, image in enumerate(images):
        row, column = divmod(index, columns)
        axis = axes[row][column]
        axis.imshow(image.permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
        axis.set_xticks([])
        axis.set_yticks([])
        if row == 0:
            axis.set_title(f"seed {seeds[column]}", fontsize=8)
        if column == 0:
            axis.set_ylabel(_wrap(prompts[row], 26), rotation=0, ha="right", va="center", fontsize=7)
    figure.suptitle(_wrap(title, 90), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_index(out: Path, run: RunAdapters, adapter: str, prompts: list[str], seeds: list[int], files: list[str],
                grid: Path) -> None:
    """samples.json: which image is which, and where the adapters came from."""
    record = {"run": str(run.source.parent), "adapters": str(run.source), "iterations": run.iterations,
              "adapter": adapter, "sampler": run.config.sampler.kind, "steps": run.config.eval.steps,
              "prompts": prompts, "seeds": seeds, "grid": grid.name,
              "images": [{"prompt": prompts[i // len(seeds)], "seed": seeds[i % len(seeds)], "file": name}
                         for i, name in enumerate(files)]}
    (out / f"samples-{adapter}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
