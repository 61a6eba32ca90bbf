"""Reading the files a user hands the project (params.yaml, prompt files): untrusted input.

Every reader goes through here, so that each file is held to the same bounds before anything
else looks at it: a regular file no larger than a limit (a 4 GB file, /dev/zero or a FIFO is one
line, not a MemoryError or a hang), strict UTF-8 (a binary file is one line naming the line it
breaks on), and for YAML a bounded nesting depth and size once aliases are expanded (a document
10 000 levels deep is one line, not a RecursionError traceback). Every failure is a ConfigError
(one line, exit code 2 at the commands) that names the file and, where there is one, the line,
and quotes at most a short prefix of the bad value.

Names read from such files that become folders (a family of params.yaml, an ablation point) are
checked here too: one path component, never a way out of the folder they are joined to.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from solrl_core.config import ConfigError, shown

# params.yaml and its like are a few kilobytes; 4 MiB leaves room for any hand-written study.
MAX_YAML_BYTES = 4 * 2**20
# A mapping of sections of sections; params.yaml nests 4 deep, a config value 2 more.
MAX_YAML_DEPTH = 32
# Values once aliases are expanded: an alias bomb of 10 short lines names 10**9 of them, and
# walking them (validation, messages) would never end. params.yaml has a few hundred.
MAX_YAML_NODES = 100_000
# Prompt sets run to hundreds of thousands of prompts (tens of MB); the bound keeps a wrong file
# (a disk image, a sparse 4 GB file) from being read into memory at all.
MAX_PROMPT_FILE_BYTES = 64 * 2**20
# No text encoder reads more than a few hundred tokens; a longer line is not a prompt.
MAX_PROMPT_LINE_BYTES = 8192
# A folder name: long enough for any variant name (explore-steps=8, sol_rl_fp8), short of any
# file system's limit once joined.
MAX_NAME_LENGTH = 64
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_QUOTED = 40  # characters of a bad value a message quotes


def clip(text: str, limit: int = 4 * _QUOTED) -> str:
    """A message part that may quote user input (a parser's complaint about a line), cut short."""
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _open_bounded(path: Path, label: str, limit: int):
    """``path`` opened for binary reading once it is known to be a regular file within ``limit``."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever; the fstat below
        # refuses it before anything is read.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file") from None
    except (OSError, ValueError) as error:  # no permission, a directory on Windows, an embedded NUL
        raise ConfigError(f"{label}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    info = os.fstat(descriptor)
    problem = None
    if stat.S_ISDIR(info.st_mode):
        problem = "is a directory, not a file"
    elif not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file (a device, a FIFO or a socket)"
    elif info.st_size > limit:
        problem = f"is {_size(info.st_size)}; such a file may be at most {_size(limit)}"
    if problem:
        os.close(descriptor)
        raise ConfigError(f"{label}: {problem}")
    return os.fdopen(descriptor, "rb")


def _decoded(data: bytes, label: str, first_line: int = 1) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line + data.count(b"\n", 0, error.start)
        column = error.start - data.rfind(b"\n", 0, error.start)  # from 1; rfind is -1 on the first line
        raise ConfigError(f"{label}: line {line} is not UTF-8 text ({error.reason} at byte {column} of the line)") \
            from None


def _read(read, size: int, label: str) -> bytes:
    try:
        return read(size)
    except OSError as error:  # an I/O error part way (a failing disk, a network file system gone)
        raise ConfigError(f"{label}: cannot read it ({error.strerror or error})") from None


def read_text(path: Path, label: str, limit: int = MAX_YAML_BYTES) -> str:
    """The whole of a small text file, as UTF-8; ``label`` starts every message (the file's name)."""
    with _open_bounded(path, label, limit) as handle:
        data = _read(handle.read, limit + 1, label)  # limit + 1: the file may have grown since fstat
    if len(data) > limit:
        raise ConfigError(f"{label}: is larger than {_size(limit)}, the most such a file may hold")
    return _decoded(data, label)


def read_lines(path: Path, label: str, limit: int = MAX_PROMPT_FILE_BYTES,
               line_limit: int = MAX_PROMPT_LINE_BYTES) -> list[tuple[int, str]]:
    """Each line of a text file with its number (from 1), read one bounded line at a time: no line
    longer than ``line_limit`` bytes is ever held, nor more than ``limit`` bytes in all."""
    lines, total = [], 0
    with _open_bounded(path, label, limit) as handle:
        for number in itertools.count(1):
            raw = _read(handle.readline, line_limit + 2, label)  # a full line and its CR LF fit, no longer one
            if not raw:
                return lines
            total += len(raw)
            if total > limit:
                raise ConfigError(f"{label}: is larger than {_size(limit)}, the most such a file may hold")
            body = raw.rstrip(b"\r\n")
            if len(body) > line_limit or (len(raw) == line_limit + 2 and not raw.endswith(b"\n")):
                raise ConfigError(f"{label}: line {number} is longer than {line_limit} bytes; "
                                  f"give one prompt per line")
            lines.append((number, _decoded(body, label, number)))
    raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends


class _TooDeep(yaml.YAMLError):
    def __init__(self, mark):
        super().__init__()
        self.mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing to compose nodes nested deeper than MAX_YAML_DEPTH: its
    composer recurses once per level, so a deep document would end in a RecursionError."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_YAML_DEPTH:
            raise _TooDeep(self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_nodes(value: Any, label: str) -> int:
    """How many values ``value`` holds once its aliases are expanded, shared ones counted per use,
    and refused where aliases stack it deeper than MAX_YAML_DEPTH (composition bounds only each
    anchor's own depth) or make it hold itself. Memoised per shared value, so an alias bomb is
    measured in a moment; the recursion stops at MAX_YAML_DEPTH."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (values, height)
    open_ids: set[int] = set()

    def too_deep() -> ConfigError:
        return ConfigError(f"{label}: nested deeper than {MAX_YAML_DEPTH} levels (aliases included)")

    def measure(item: Any, depth: int) -> tuple[int, int]:
        if not isinstance(item, (list, dict)):
            return 1, 0
        if id(item) in open_ids:  # an alias inside its own anchor: a value that holds itself
            raise ConfigError(f"{label}: an alias refers to a value that holds it (a loop)")
        if depth > MAX_YAML_DEPTH:
            raise too_deep()
        if id(item) not in measured:
            open_ids.add(id(item))
            children = [part for pair in item.items() for part in pair] if isinstance(item, dict) else item
            sizes = [measure(child, depth + 1) for child in children]
            measured[id(item)] = (1 + sum(n for n, _ in sizes), 1 + max((h for _, h in sizes), default=0))
            open_ids.discard(id(item))
        values, height = measured[id(item)]
        if depth + height > MAX_YAML_DEPTH:
            raise too_deep()
        return values, height

    return measure(value, 0)[0]


def parse_yaml(text: str, label: str) -> Any:
    """YAML text read with the safe loader, its depth and expanded size bounded."""
    try:
        value = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except _TooDeep as error:
        raise ConfigError(f"{label}: line {error.mark.line + 1}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    except yaml.reader.ReaderError as error:  # a control character such as NUL
        line = text.count("\n", 0, error.position) + 1
        raise ConfigError(f"{label}: line {line}: not valid YAML (character #x{error.character:04x} "
                          f"is not allowed)") from None
    except yaml.MarkedYAMLError as error:
        where = f"line {error.problem_mark.line + 1}: " if error.problem_mark else ""
        problem = clip(error.problem or error.context or "unreadable")
        raise ConfigError(f"{label}: {where}not valid YAML ({problem})") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{label}: not valid YAML ({clip(str(error) or 'unreadable')})") from None
    except ValueError:  # an integer of more than 4300 digits
        raise ConfigError(f"{label}: holds a number too long to read") from None
    except RecursionError:  # not reached with the depth bound; kept so no input is a traceback
        raise ConfigError(f"{label}: nested too deep") from None
    if _expanded_nodes(value, label) > MAX_YAML_NODES:
        raise ConfigError(f"{label}: holds more than {MAX_YAML_NODES} values once its aliases are expanded")
    return value


def load_yaml(path: Path, label: str | None = None, limit: int = MAX_YAML_BYTES) -> Any:
    """A user's YAML file (params.yaml), read and parsed within the bounds above."""
    label = label or str(path)
    return parse_yaml(read_text(path, label, limit), label)


def path_component(value: Any, where: str) -> str:
    """``value`` as one safe folder name: letters, digits and ``._-``, not ``.`` or ``..``, at most
    MAX_NAME_LENGTH characters. A name from a file becomes a folder under the study's root; a
    ``/``, ``..`` or an absolute name would put a run outside it."""
    if (not isinstance(value, str) or not _NAME.fullmatch(value) or value in (".", "..")
            or len(value) > MAX_NAME_LENGTH):
        raise ConfigError(f"{where}: {shown(value, _QUOTED)} is not a usable name; a name becomes a folder: use "
                          f"letters, digits, '.', '_' and '-' (not '.' or '..'), at most {MAX_NAME_LENGTH} characters")
    return value
