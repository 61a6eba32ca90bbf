"""The model card (README.md) of an exported adapter: what it is, what the run measured, how to load it.

Its front matter is the Hugging Face Hub's (``base_model``, ``library_name``, ``tags``), so a
pushed export is listed under its base model.
"""

from __future__ import annotations

from pathlib import Path

CARD = "README.md"


def write_card(out: Path, run, adapter: str, fmt: str, lora_format, summary: dict | None) -> Path:
    config, lora = run.config, run.config.train.lora
    base = lora_format.base_model
    front = ["---", f"library_name: {fmt}", *([f"base_model: {base}"] if base else []),
             "tags: [lora, text-to-image, solrl, reinforcement-learning]", "---", ""]
    which = "the EMA adapter, which the run evaluates" if adapter == "ema" else "the trained adapter (not averaged)"
    lines = [
        f"# {config.preset} / {config.family}: LoRA after {run.iterations} "
        f"iteration{'' if run.iterations == 1 else 's'}", "",
        f"A LoRA adapter trained with Sol-RL (arXiv 2604.06916), {which}.", "",
        "| | |", "|---|---|",
        f"| base model | {base or 'shapes-tiny, the embedded world of the Sol-RL repository (not on the Hub)'} |",
        f"| transformer | `{lora_format.transformer}` |",
        f"| preset / family | {config.preset} / {config.family} |",
        f"| iterations | {run.iterations} |",
        f"| adapter | {adapter} ({run.source.name}) |",
        f"| LoRA | rank {lora.rank}, alpha {lora.alpha} (scale {lora.alpha / lora.rank:g}), "
        f"targets {', '.join(lora.targets)} |",
        f"| sampler | {config.sampler.kind}, {config.eval.steps} steps, shift {config.sampler.shift:g} |",
        *_reward_rows(summary), "",
        "## How to load", "", *_how_to_load(fmt, lora_format), "",
    ]
    path = out / CARD
    path.write_text("\n".join(front + lines), encoding="utf-8")
    return path


def _reward_rows(summary: dict | None) -> list[str]:
    if summary is None:
        return ["| evaluation | none recorded for these adapters yet (a run still going, or extended since) |"]
    base, final = summary.get("eval_reward_base", {}), summary.get("eval_reward_final", {})
    return [f"| {name} (held-out) | base {base.get(name, float('nan')):.4f}, final {value:.4f} |"
            for name, value in final.items()]


def _how_to_load(fmt: str, lora_format) -> list[str]:
    if fmt == "peft":
        base = "transformer" if lora_format.base_model is None else "pipe.transformer"
        return ["```python", "from peft import PeftModel", "",
                f"model = PeftModel.from_pretrained({base}, \"DIR\")  # DIR: this folder; "
                f"{base}: a {lora_format.transformer}", "```"]
    if lora_format.base_model is None:  # the embedded world has no diffusers pipeline: its transformer takes it
        # The folder and weight_name, not the file's path: given a path, diffusers reads no metadata
        # and takes alpha = rank.
        return ["```python", "transformer.load_lora_adapter(\"DIR\", weight_name=\"pytorch_lora_weights.safetensors\", "
                "prefix=\"transformer\")", "```", "",
                "or draw from the run itself: `solrl sample RUN --prompt \"...\"`."]
    return ["```python", "import torch", f"from diffusers import {lora_format.pipeline}", "",
            f"pipe = {lora_format.pipeline}.from_pretrained(\"{lora_format.base_model}\", torch_dtype=torch.bfloat16)",
            "pipe.load_lora_weights(\"DIR\")  # DIR: this folder (or the Hub repo it was pushed to)", "```"]
