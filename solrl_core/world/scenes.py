"""Scenes of the embedded "shapes" world and their renderer.

A scene is a flat background with one or two coloured shapes placed on a 3x3 grid. Every
geometric fact (where a grid cell is, how big "small" is, what a triangle looks like) lives
here; the analytic rewards take their targets from this renderer's own drawings, so the two
can never disagree about them.

Coordinates are fractions of the image side (x to the right, y downwards), so the same scene
renders at any resolution.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Object colours, chosen far apart in RGB (every pair is at least ~0.4 apart) so a pixel's
# colour says unambiguously which object it belongs to.
OBJECT_COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.10, 0.10),
    "green": (0.10, 0.70, 0.20),
    "blue": (0.15, 0.25, 0.90),
    "yellow": (1.00, 0.90, 0.10),
    "purple": (0.55, 0.15, 0.70),
    "orange": (1.00, 0.50, 0.00),
    "white": (1.00, 1.00, 1.00),
    "black": (0.00, 0.00, 0.00),
}
BACKGROUND_COLOURS: dict[str, tuple[float, float, float]] = {
    "white": (1.00, 1.00, 1.00),
    "black": (0.00, 0.00, 0.00),
    "gray": (0.50, 0.50, 0.50),
}
# Every colour a clean image of this world may contain; the aesthetic reward measures purity
# against this set.
PALETTE: dict[str, tuple[float, float, float]] = {**OBJECT_COLOURS, **BACKGROUND_COLOURS}

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SIZES: tuple[str, ...] = ("small", "large")

# The 3x3 grid, row by row, as (column, row) cells.
POSITIONS: dict[str, tuple[int, int]] = {
    "top left": (0, 0),
    "top": (1, 0),
    "top right": (2, 0),
    "left": (0, 1),
    "center": (1, 1),
    "right": (2, 1),
    "bottom left": (0, 2),
    "bottom": (1, 2),
    "bottom right": (2, 2),
}

# Half-width of a shape's bounding box, as a fraction of the image side. A large shape
# (0.155) stays inside its grid cell (half-width 1/6), so two objects never overlap.
EXTENT: dict[str, float] = {"small": 0.09, "large": 0.155}

# Sub-pixels per pixel side: edges are anti-aliased by averaging a finer grid, which keeps
# the renderer deterministic (no random sampling) and the images smooth to learn.
SUPERSAMPLE = 4


@dataclass(frozen=True)
class ShapeSpec:
    shape: str
    colour: str
    size: str
    position: str

    def __post_init__(self) -> None:
        _require(self.shape in SHAPES, f"unknown shape {self.shape!r}; known: {SHAPES}")
        _require(self.colour in OBJECT_COLOURS, f"unknown colour {self.colour!r}; known: {tuple(OBJECT_COLOURS)}")
        _require(self.size in SIZES, f"unknown size {self.size!r}; known: {SIZES}")
        _require(self.position in POSITIONS, f"unknown position {self.position!r}; known: {tuple(POSITIONS)}")


@dataclass(frozen=True)
class Scene:
    background: str
    objects: tuple[ShapeSpec, ...]

    def __post_init__(self) -> None:
        _require(self.background in BACKGROUND_COLOURS,
                 f"unknown background {self.background!r}; known: {tuple(BACKGROUND_COLOURS)}")
        _require(1 <= len(self.objects) <= 2, f"a scene has 1 or 2 objects, got {len(self.objects)}")
        positions = [spec.position for spec in self.objects]
        _require(len(set(positions)) == len(positions), f"two objects share a position: {positions}")
        # Distinct colours let a reward find each object by its colour alone.
        colours = [spec.colour for spec in self.objects]
        _require(len(set(colours)) == len(colours), f"two objects share a colour: {colours}")
        _require(self.background not in colours,
                 f"an object has the background colour {self.background!r}; it would be invisible")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def sample_scene(rng: random.Random, max_objects: int = 2, two_object_prob: float = 0.3) -> Scene:
    """Draw a valid scene; the same rng state always gives the same scene."""
    background = rng.choice(sorted(BACKGROUND_COLOURS))
    object_count = 2 if max_objects >= 2 and rng.random() < two_object_prob else 1
    colours = rng.sample([c for c in OBJECT_COLOURS if c != background], object_count)
    positions = rng.sample(list(POSITIONS), object_count)
    objects = tuple(
        ShapeSpec(shape=rng.choice(SHAPES), colour=colour, size=rng.choice(SIZES), position=position)
        for colour, position in zip(colours, positions)
    )
    return Scene(background=background, objects=objects)


def cell_centre(position: str) -> tuple[float, float]:
    """(x, y) centre of a grid cell, as fractions of the image side."""
    column, row = POSITIONS[position]
    return ((column + 0.5) / 3.0, (row + 0.5) / 3.0)


def render(scene: Scene, size: int = 32) -> torch.Tensor:
    """Draw a scene as a float32 [3, size, size] image in [0, 1]; a pure function of its inputs."""
    image = _solid(BACKGROUND_COLOURS[scene.background], size)
    for spec in scene.objects:
        coverage = _coverage(spec, size)
        colour = torch.tensor(OBJECT_COLOURS[spec.colour], dtype=torch.float32).view(3, 1, 1)
        image = image * (1.0 - coverage) + colour * coverage
    return image.clamp(0.0, 1.0)


def _solid(rgb: tuple[float, float, float], size: int) -> torch.Tensor:
    return torch.tensor(rgb, dtype=torch.float32).view(3, 1, 1).expand(3, size, size).clone()


def _coverage(spec: ShapeSpec, size: int) -> torch.Tensor:
    """Fraction of each pixel the shape covers, [1, size, size], from a supersampled inside-test."""
    fine = size * SUPERSAMPLE
    coords = (torch.arange(fine, dtype=torch.float32) + 0.5) / fine
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    inside = _inside(spec, x, y).to(torch.float32)
    return F.avg_pool2d(inside[None, None], SUPERSAMPLE)[0]


def _inside(spec: ShapeSpec, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    cx, cy = cell_centre(spec.position)
    r = EXTENT[spec.size]
    dx, dy = x - cx, y - cy
    if spec.shape == "circle":
        return dx * dx + dy * dy <= r * r
    if spec.shape == "square":
        return (dx.abs() <= r) & (dy.abs() <= r)
    # Upright isosceles triangle filling its box: apex at the top centre, base along the bottom;
    # its half-width grows linearly from 0 at the apex to r at the base.
    return (dy <= r) & (dx.abs() <= (dy + r) / 2.0)
