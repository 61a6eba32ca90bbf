"""Progress bars: one per stage, quiet when disabled, under CI, or when stderr is not a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], label: str, enabled: bool = True) -> Iterator[T]:
    show = enabled and not os.environ.get("CI") and sys.stderr.isatty()
    yield from tqdm(items, desc=f"{label:>10}", leave=False, disable=not show, dynamic_ncols=True)
