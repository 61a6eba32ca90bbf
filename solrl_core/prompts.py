"""Training and held-out evaluation prompts: from text files, or from the embedded world."""

from __future__ import annotations

import importlib
from pathlib import Path

from solrl_core.config import Config, ConfigError
from solrl_core.safe_input import clip, read_lines
from solrl_core.world.captions import held_out_prompts
from solrl_core.world.captions import training_prompts as world_training_prompts

WORLD_PROMPT_SEED = 7  # the generated prompt sets are part of the world, not of a run


def training_prompts(config: Config) -> list[str]:
    if config.prompts.train_file:
        return read_prompt_file(config.prompts.train_file, "prompts.train_file")
    return world_training_prompts(config.prompts.train_pool, WORLD_PROMPT_SEED)


def evaluation_prompts(config: Config) -> list[str]:
    if config.prompts.eval_file:
        return read_prompt_file(config.prompts.eval_file, "prompts.eval_file")[: config.eval.prompts]
    return held_out_prompts(config.eval.prompts, WORLD_PROMPT_SEED)


# Rewards that read a prompt's structure, and the grammar they read it by (module, parser, what a
# prompt must look like): a line outside the grammar would fail the first scoring, after the run
# started. Every other reward (the real reward models) scores any text.
PROMPT_GRAMMARS = {
    "shapes-compliance": ("solrl_core.world.captions", "parse_caption",
                          "a shapes caption such as 'a large red circle at the top left on a white background'"),
}


def check_prompt_files(config: Config) -> None:
    """Read the prompt files the config names, so that a missing, empty or unreadable one, or a
    line the rewards cannot read, stops a run before it starts (one line, exit code 2) instead of
    at its first stage. Training prompts are scored by ``rewards``, evaluation prompts by those and
    ``eval.rewards``."""
    readers = {"train_file": list(config.rewards), "eval_file": [*config.rewards, *config.eval.rewards]}
    for key, rewards in readers.items():
        path = getattr(config.prompts, key)
        if path:
            file, lines = _prompt_lines(path, f"prompts.{key}")
            for reward in dict.fromkeys(rewards):
                if reward in PROMPT_GRAMMARS:
                    _check_grammar(file, lines, f"prompts.{key}", reward)


def _check_grammar(file: Path, lines: list[tuple[int, str]], key: str, reward: str) -> None:
    module, parser, expected = PROMPT_GRAMMARS[reward]
    parse = getattr(importlib.import_module(module), parser)
    for number, prompt in lines:
        try:
            parse(prompt)
        except ValueError as error:
            # The parser's message quotes the whole line: a short prefix of it is enough.
            raise ConfigError(f"{key}: line {number} of {file} cannot be read by the reward '{reward}' "
                              f"({clip(str(error))}); "
                              f"write one prompt per line, each {expected}") from None


def prompt_file_path(path: str, key: str) -> Path:
    """``path`` resolved (``~`` expanded; a relative path against the working directory)."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as error:  # ~nosuchuser, an embedded NUL, a loop
        raise ConfigError(f"{key}: cannot resolve {path!r} ({error}); give a text file with one prompt per line") \
            from None


def read_prompt_file(path: str, key: str) -> list[str]:
    return [prompt for _, prompt in _prompt_lines(path, key)[1]]


def _prompt_lines(path: str, key: str) -> tuple[Path, list[tuple[int, str]]]:
    """The resolved file and its prompts with their line numbers (from 1; blank lines skipped),
    read within safe_input's bounds (file size, line length, UTF-8)."""
    file = prompt_file_path(path, key)
    try:
        if file.is_dir():
            raise ConfigError(f"{key}: {file} is a directory; give a text file with one prompt per line")
        if not file.exists():  # a FIFO or a device exists: the reader says what it is
            raise ConfigError(f"{key}: no file at {file}; give a text file with one prompt per line")
    except OSError as error:  # a path too long to stat, a loop of links
        raise ConfigError(f"{key}: cannot read {file}: {error.strerror or error}") from None
    lines = read_lines(file, f"{key}: {file}")
    prompts = [(number, line.strip()) for number, line in lines if line.strip()]
    if not prompts:
        raise ConfigError(f"{key}: {file} holds no prompts; give one prompt per line")
    return file, prompts
