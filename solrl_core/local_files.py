"""Finding a model's or a reward model's files on this machine, never over the network.

Models and rewards name their files the same way: a source is a local path (absolute, relative
to the working directory, or ``~``-prefixed) or a Hugging Face repo id, looked up in the local
cache only. One rule decides which a source can be (:func:`is_repo_id`), so a model and a reward
given the same text search the same places and say the same thing when the files are not there.
Callers differ only in whether a file may stand for its folder (a reward's checkpoint file names
the folder holding the rest; a model is always a folder).

A leaf: nothing from ``solrl_core`` but config's one-line error helper.
"""

from __future__ import annotations

import re
from pathlib import Path

from solrl_core.config import one_line

# A Hub repo id as the Hub itself accepts one: ``owner/name``, or a bare ``name`` (the Hub's
# canonical repos, e.g. "bert-base-uncased", which ImageReward's tokenizer is); each part letters,
# digits, "-", "_" and ".", starting and ending with a letter or digit. So a source with two
# slashes, a leading "/", "." or "~", or a trailing "/" is only ever a local path.
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}")

# A tokenizer whose vocabulary covers less than this share of its text encoder's embedding table
# was not really loaded: transformers 5 returns a near-empty tokenizer (about a hundred special
# tokens) instead of raising when its files are missing offline. Real pairs are at >= 0.99.
MIN_VOCAB_COVERAGE = 0.5


class ModelFilesMissing(FileNotFoundError):
    """Model or reward-model files are not on this machine; the message is one actionable line."""

    def __init__(self, message: str = ""):
        super().__init__(one_line(str(message)))


def is_repo_id(source: str) -> bool:
    """Whether ``source`` may name a repo in the local Hugging Face cache (see ``_REPO_ID``)."""
    return _REPO_ID.fullmatch(source) is not None


def local_path(source: str) -> Path | None:
    """``source`` as an absolute local path (``~`` expanded, a relative path resolved against the
    working directory), or None where it cannot name one (``~nosuchuser``, a NUL, too long)."""
    try:
        return Path(source).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def path_kind(path: Path | None) -> str:
    """"folder", "file", "missing" (or "unreadable"), for messages and checks that must not raise."""
    try:
        return "missing" if path is None or not path.exists() else "folder" if path.is_dir() else "file"
    except (OSError, ValueError):
        return "unreadable"


def cached_snapshot(repo_id: str) -> Path | None:
    """The repo's folder in the local Hugging Face cache, or None; never touches the network."""
    # deferred: huggingface_hub at import time (start-up of every solrl command; used once a real model is looked up)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not available offline"
        return None


def find_folder(source: str, file_names_folder: bool = False) -> Path | None:
    """The local folder ``source`` names: a folder on disk first, then a repo in the local cache;
    with ``file_names_folder`` an existing file stands for the folder it is in. None if neither."""
    candidate = local_path(source)
    kind = path_kind(candidate)
    if kind == "folder":
        return candidate
    if kind == "file":
        return candidate.parent if file_names_folder else None
    return cached_snapshot(source) if is_repo_id(source) else None


def why_not_found(source: str, file_names_folder: bool = False) -> str:
    """Why :func:`find_folder` found nothing for ``source``, naming the absolute path it looked at
    and, where the source can be a repo id, the cache."""
    path = local_path(source)
    if path_kind(path) == "file" and not file_names_folder:
        return f"{path} is a file, not a folder"
    what = "file or folder" if file_names_folder else "folder"
    looked = f"no {what} at {path}" if path is not None else "not a usable path"
    return f"{looked}, not in the local Hugging Face cache" if is_repo_id(source) else looked


def check_tokenizer(label: str, tokenizer, vocab_size: int, where: Path | str) -> None:
    """Raise when a tokenizer is far smaller (or larger) than its model's embedding table."""
    size = len(tokenizer)
    if not MIN_VOCAB_COVERAGE * vocab_size <= size <= vocab_size:
        raise ModelFilesMissing(
            f"{label}: the tokenizer loaded from {where} has {size} tokens but the model's embedding "
            f"table has {vocab_size}; its vocabulary files are missing or belong to another model"
        )
