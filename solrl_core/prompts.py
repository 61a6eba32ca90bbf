"""Training and held-out evaluation prompts: from text files, or from the embedded world."""

from __future__ import annotations

from pathlib import Path

from solrl_core.config import Config, ConfigError

WORLD_PROMPT_SEED = 7  # the generated prompt sets are part of the world, not of a run


def training_prompts(config: Config) -> list[str]:
    if config.prompts.train_file:
        return read_prompt_file(config.prompts.train_file, "prompts.train_file")
    from solrl_core.world.captions import training_prompts as world_training

    return world_training(config.prompts.train_pool, WORLD_PROMPT_SEED)


def evaluation_prompts(config: Config) -> list[str]:
    if config.prompts.eval_file:
        return read_prompt_file(config.prompts.eval_file, "prompts.eval_file")[: config.eval.prompts]
    from solrl_core.world.captions import held_out_prompts

    return held_out_prompts(config.eval.prompts, WORLD_PROMPT_SEED)


def read_prompt_file(path: str, key: str) -> list[str]:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"{key}: no file at {file}; give a text file with one prompt per line")
    prompts = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ConfigError(f"{key}: {file} holds no prompts; give one prompt per line")
    return prompts
