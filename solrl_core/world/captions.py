"""Captions of the shapes world: a small grammar, its parser, a word tokenizer and prompt sets.

Grammar (words in braces are chosen from the scene, slashes are surface variants):

    caption    := object [" and " object] " " background
    object     := article " " size " " colour " " shape " " where
    article    := "a" / "one"
    where      := "at the top left" | "at the top" | "at the top right" | "on the left"
                | "in the center" / "in the middle" | "on the right" | "at the bottom left"
                | "at the bottom" | "at the bottom right"
    background := "on a {colour} background" / "against a {colour} background"

The first variant of each choice is the canonical form; `caption(scene)` without an rng
always writes it, and `parse_caption` reads every variant.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Callable

import torch

from solrl_core.world.scenes import (
    BACKGROUND_COLOURS,
    OBJECT_COLOURS,
    POSITIONS,
    SHAPES,
    SIZES,
    Scene,
    ShapeSpec,
    sample_scene,
)

ARTICLES: tuple[str, ...] = ("a", "one")
POSITION_PHRASES: dict[str, tuple[str, ...]] = {
    "top left": ("at the top left",),
    "top": ("at the top",),
    "top right": ("at the top right",),
    "left": ("on the left",),
    "center": ("in the center", "in the middle"),
    "right": ("on the right",),
    "bottom left": ("at the bottom left",),
    "bottom": ("at the bottom",),
    "bottom right": ("at the bottom right",),
}
BACKGROUND_LEADS: tuple[str, ...] = ("on a", "against a")
OBJECT_JOINER = "and"

PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1


def _grammar_words() -> list[str]:
    phrases = [*ARTICLES, *SIZES, *OBJECT_COLOURS, *SHAPES, *BACKGROUND_COLOURS, *BACKGROUND_LEADS,
               OBJECT_JOINER, "background", *itertools.chain.from_iterable(POSITION_PHRASES.values())]
    return sorted({word for phrase in phrases for word in phrase.split()})


# Sorted so that token ids never depend on dict order or on who imported what first.
VOCAB: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN, *_grammar_words())
WORD_TO_ID: dict[str, int] = {word: index for index, word in enumerate(VOCAB)}


def _longest(phrases) -> int:
    return max(len(phrase.split()) for phrase in phrases)


# Two objects of the longest wording, the joiner, then the longest background phrase.
MAX_CAPTION_TOKENS: int = (
    2 * (_longest(ARTICLES) + 1 + 1 + 1 + _longest(itertools.chain.from_iterable(POSITION_PHRASES.values())))
    + 1
    + _longest(BACKGROUND_LEADS) + 2
)

# --- writing -------------------------------------------------------------------------------


def caption(scene: Scene, rng: random.Random | None = None) -> str:
    """Describe a scene; with an rng, surface variants are drawn, without it the canonical form."""
    pick = (lambda options: options[0]) if rng is None else rng.choice
    objects = f" {OBJECT_JOINER} ".join(_object_phrase(spec, pick) for spec in scene.objects)
    return f"{objects} {pick(BACKGROUND_LEADS)} {scene.background} background"


def _object_phrase(spec: ShapeSpec, pick: Callable) -> str:
    return f"{pick(ARTICLES)} {spec.size} {spec.colour} {spec.shape} {pick(POSITION_PHRASES[spec.position])}"


# --- reading -------------------------------------------------------------------------------


def _object_phrase_table() -> dict[str, ShapeSpec]:
    """Every way of writing every object: the grammar is small enough to enumerate."""
    table = {}
    for shape, colour, size, position in itertools.product(SHAPES, OBJECT_COLOURS, SIZES, POSITIONS):
        spec = ShapeSpec(shape=shape, colour=colour, size=size, position=position)
        for article, where in itertools.product(ARTICLES, POSITION_PHRASES[position]):
            table[f"{article} {size} {colour} {shape} {where}"] = spec
    return table


_OBJECT_PHRASES = _object_phrase_table()
_BACKGROUND_PATTERN = re.compile(
    r"^(?P<objects>.+) (?:" + "|".join(map(re.escape, BACKGROUND_LEADS)) + r") (?P<background>\w+) background$"
)


def normalise(text: str) -> str:
    """Lower-case, drop punctuation and collapse whitespace: what the grammar compares."""
    return " ".join(re.sub(r"[.,;:!?]", " ", text.lower()).split())


def parse_caption(text: str) -> Scene:
    """Read a caption back into its scene; ValueError for anything outside the grammar."""
    clean = normalise(text)
    match = _BACKGROUND_PATTERN.match(clean)
    if match is None:
        raise ValueError(f"not a shapes caption (expected '... on a <colour> background'): {text!r}")
    background = match["background"]
    if background not in BACKGROUND_COLOURS:
        raise ValueError(f"unknown background colour {background!r} in {text!r}; known: {tuple(BACKGROUND_COLOURS)}")
    objects = tuple(_parse_object(phrase, text) for phrase in match["objects"].split(f" {OBJECT_JOINER} "))
    try:
        return Scene(background=background, objects=objects)
    except ValueError as error:
        raise ValueError(f"caption describes an invalid scene ({error}): {text!r}") from None


def _parse_object(phrase: str, text: str) -> ShapeSpec:
    spec = _OBJECT_PHRASES.get(phrase)
    if spec is None:
        raise ValueError(
            f"cannot read object {phrase!r} in {text!r}; expected "
            f"'<a|one> <size> <colour> <shape> <position phrase>', e.g. 'a large red circle at the top left'"
        )
    return spec


# --- tokens --------------------------------------------------------------------------------


def tokenize(texts: list[str], max_len: int = MAX_CAPTION_TOKENS) -> torch.LongTensor:
    """Word ids [B, max_len], padded with PAD_ID and truncated; unknown words map to UNK_ID."""
    ids = torch.full((len(texts), max_len), PAD_ID, dtype=torch.long)
    for row, text in enumerate(texts):
        words = normalise(text).split()[:max_len]
        ids[row, : len(words)] = torch.tensor([WORD_TO_ID.get(word, UNK_ID) for word in words], dtype=torch.long)
    return ids


# --- prompt sets ---------------------------------------------------------------------------

# One scene in HELD_OUT_BUCKETS is reserved for evaluation.
HELD_OUT_BUCKETS = 8


def is_held_out(scene: Scene) -> bool:
    """A stable split of scenes (not of strings), so no wording of an evaluation scene is trained on.

    The key ignores the order of the objects: "A and B" and "B and A" draw the same image.
    """
    key = "|".join(sorted(_object_phrase(spec, lambda options: options[0]) for spec in scene.objects))
    digest = hashlib.sha256(f"{key}|{scene.background}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_BUCKETS == 0


def held_out_prompts(n: int, seed: int) -> list[str]:
    """n distinct evaluation captions, canonical wording, deterministic in (n, seed)."""
    return _prompt_set(n, seed, held_out=True, vary_wording=False)


def training_prompts(n: int, seed: int) -> list[str]:
    """n captions of distinct training scenes with varied wording, deterministic in (n, seed)."""
    return _prompt_set(n, seed, held_out=False, vary_wording=True)


def _prompt_set(n: int, seed: int, held_out: bool, vary_wording: bool) -> list[str]:
    rng = random.Random(f"shapes-prompts|{seed}|{'held-out' if held_out else 'training'}")
    seen: set[Scene] = set()
    prompts: list[str] = []
    # Generous bound: the held-out side alone holds tens of thousands of scenes.
    for _ in range(200 * n + 1000):
        if len(prompts) == n:
            return prompts
        scene = sample_scene(rng)
        if is_held_out(scene) != held_out or scene in seen:
            continue
        seen.add(scene)
        prompts.append(caption(scene, rng if vary_wording else None))
    if len(prompts) == n:
        return prompts
    raise ValueError(f"could not draw {n} distinct {'held-out' if held_out else 'training'} prompts")
