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


def check_prompt_files(config: Config) -> None:
    """Read the prompt files the config names, so that a missing, empty or unreadable one stops a
    run before it starts (one line, exit code 2) instead of at its first stage."""
    for key in ("train_file", "eval_file"):
        path = getattr(config.prompts, key)
        if path:
            read_prompt_file(path, f"prompts.{key}")


def prompt_file_path(path: str, key: str) -> Path:
    """``path`` resolved (``~`` expanded; a relative path against the working directory)."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as error:  # ~nosuchuser, an embedded NUL, a loop
        raise ConfigError(f"{key}: cannot resolve {path!r} ({error}); give a text file with one prompt per line") \
            from None


def read_prompt_file(path: str, key: str) -> list[str]:
    file = prompt_file_path(path, key)
    try:
        if file.is_dir():
            raise ConfigError(f"{key}: {file} is a directory; give a text file with one prompt per line")
        if not file.is_file():
            raise ConfigError(f"{key}: no file at {file}; give a text file with one prompt per line")
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{key}: {file} is not UTF-8 text ({error.reason} at byte {error.start}); "
                          "give a text file with one prompt per line") from None
    except OSError as error:
        raise ConfigError(f"{key}: cannot read {file}: {error.strerror or error}") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ConfigError(f"{key}: {file} holds no prompts; give one prompt per line")
    return prompts
