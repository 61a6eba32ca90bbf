"""Analytic rewards of the shapes world, in [0, 1]: stand-ins for learned reward models.

Both rewards are smooth functions of the pixels (soft memberships, Gaussian and logistic
scores, no hard thresholds), so a slightly better image earns a slightly higher reward: RL
needs that graded signal. Each image is scored on its own, so batch order never changes a score.

shapes_compliance(images, prompts): does the image show what the caption asks?
shapes_aesthetic(images, prompts):  is it a clean picture (flat, pure colours, crisp edges)?
"""

from __future__ import annotations

from functools import lru_cache

import torch

from solrl_core.world.captions import parse_caption
from solrl_core.world.scenes import BACKGROUND_COLOURS, OBJECT_COLOURS, PALETTE, Scene, ShapeSpec, render

MAX_OBJECTS = 2
_EPS = 1e-6

# --- compliance tolerances -----------------------------------------------------------------
# RGB distance from the requested colour that still counts as that colour. Memberships fall
# as exp(-(d / tolerance)^4 / 2): flat for small errors (noise, slight tints), then steep, so a
# neighbouring palette colour (>= 0.4 away) counts ~3e-4, and faint tints summed over a whole
# canvas cannot pose as an object.
COLOUR_TOLERANCE = 0.2
# Mixes well below this are treated as noise, not as faint object: summed over a whole
# canvas, a background jittering by 0.01 would otherwise add pixels of "object" everywhere,
# and the faint dark or pale rims of *another* object's edges would pass for this one.
NOISE_MIX = 0.15
# Floor of the mix when un-mixing a pixel's colour (see object_coverage): keeps the division
# finite; pixels that faint are gated off by NOISE_MIX anyway.
MIN_MIX = 0.05
# Drawn area vs the reference drawing, in log ratio: a "small" drawn for a "large" (area
# ratio ~3) keeps ~0.2; nothing drawn scores 0.
AREA_LOG_TOLERANCE = 0.6
# Centroid distance, as a fraction of the image side; the neighbouring grid cell is 1/3 away.
LOCATION_TOLERANCE = 0.08
# Fill of the soft bounding box: about 0.6 for a triangle, 0.8 for a circle, 1.0 for a square.
FILL_TOLERANCE = 0.07
# Once an object's colour is present in the right amount, its score splits between these.
BASE_WEIGHT, LOCATION_WEIGHT, SHAPE_WEIGHT = 0.2, 0.5, 0.3
# A wrong background costs this share; it scales the objects' score rather than adding to it,
# so an empty canvas of the right colour earns nothing.
BACKGROUND_WEIGHT = 0.3

# --- aesthetic tolerances ------------------------------------------------------------------
# Distance to the nearest palette colour that still counts as pure.
PURITY_TOLERANCE = 0.08
# Median absolute Laplacian at which flatness falls to 1/e: a clean render keeps 1, Gaussian
# noise of sigma 0.01 / 0.05 / 0.1 about 0.8 / 0.36 / 0.15 (clipping at 0 and 1 hides some).
NOISE_SCALE = 0.1
# Edge-width ratio (see edge_crispness): ~2 for a one-pixel step, ~2.4 on average for the
# anti-aliased renders, ~3.4 after a Gaussian blur of one pixel.
BLUR_RATIO_MIDPOINT, BLUR_RATIO_SCALE = 3.0, 0.12
# Exponents of the weighted geometric mean: any one defect pulls the whole score down.
PURITY_WEIGHT, FLATNESS_WEIGHT, CRISPNESS_WEIGHT = 0.4, 0.3, 0.3


# === compliance ============================================================================


def _steep_closeness(distance_sq: torch.Tensor, tolerance: float) -> torch.Tensor:
    return torch.exp(-0.5 * (distance_sq / tolerance**2).square())


def object_coverage(images: torch.Tensor, object_rgb: torch.Tensor, background_rgb: torch.Tensor) -> torch.Tensor:
    """Soft estimate of how much of each pixel the requested object covers, [B, K, H, W].

    A pixel partly covered by the object is a mix bg + m * (object - bg); projecting onto that
    mixing line recovers m, so anti-aliased edges count by the area they cover. Colours off the
    line (another object, a wrong hue) are discounted by their distance from it.
    """
    # Dot products are expanded (|a - b|^2 = |a|^2 - 2 a.b + |b|^2) so nothing of size
    # [B, K, 3, H, W] is ever built: this is the hot loop of the reward.
    direction = object_rgb - background_rgb[:, None]                            # [B, K, 3]
    offset = images - background_rgb[:, :, None, None]                          # [B, 3, H, W]
    length_sq = direction.square().sum(dim=-1).clamp_min(_EPS)[..., None, None]  # [B, K, 1, 1]
    along = torch.einsum("bchw,bkc->bkhw", offset, direction)                   # offset . direction
    mix = (along / length_sq).clamp(0.0, 1.0)                                   # [B, K, H, W]
    offset_sq = offset.square().sum(dim=1, keepdim=True)                        # [B, 1, H, W]
    off_line_sq = (offset_sq - 2 * mix * along + mix.square() * length_sq).clamp_min(0.0)
    # Dividing by the mix un-mixes the pixel: it is the distance between the colour the pixel
    # would have at full coverage and the requested colour, so a faint rim of *another*
    # object's edge is judged by that object's colour, not waved through as a near-background.
    unmixed_error_sq = off_line_sq / mix.clamp_min(MIN_MIX).square()
    noise_gate = mix.square() / (mix.square() + NOISE_MIX**2)
    return mix * noise_gate * _steep_closeness(unmixed_error_sq, COLOUR_TOLERANCE)


def measure_objects(coverage: torch.Tensor) -> dict[str, torch.Tensor]:
    """Area (fraction of the image), centroid (fractions of the side) and box fill of coverage maps [..., H, W].

    The bounding box is soft: each column counts by the largest coverage in it, so partial
    columns at anti-aliased edges count partially and the fill moves smoothly with the pixels.
    """
    height, width = coverage.shape[-2:]
    xs = (torch.arange(width, dtype=torch.float32, device=coverage.device) + 0.5) / width
    ys = (torch.arange(height, dtype=torch.float32, device=coverage.device) + 0.5) / height
    mass = coverage.sum(dim=(-2, -1))
    safe_mass = mass.clamp_min(_EPS)
    box_width = coverage.amax(dim=-2).sum(dim=-1)
    box_height = coverage.amax(dim=-1).sum(dim=-1)
    return {
        "area": mass / (height * width),
        "centroid_x": (coverage.sum(dim=-2) * xs).sum(dim=-1) / safe_mass,
        "centroid_y": (coverage.sum(dim=-1) * ys).sum(dim=-1) / safe_mass,
        "fill": mass / (box_width * box_height).clamp_min(_EPS),
    }


@lru_cache(maxsize=4096)
def _reference_measurements(spec: ShapeSpec, image_size: int) -> tuple[float, float, float, float]:
    """What the renderer's own drawing of this object measures at this resolution.

    Targets come from the ideal drawing rather than from continuous geometry, so pixel-grid
    effects (a small triangle's apex is a fraction of a pixel) never penalise a perfect image.
    The drawing is measured exactly as a scored image is (object_coverage, then
    measure_objects); colour does not change coverage, so a white object on black is drawn.
    """
    drawing = ShapeSpec(shape=spec.shape, colour="white", size=spec.size, position=spec.position)
    image = render(Scene(background="black", objects=(drawing,)), image_size)[None]
    white, black = torch.ones(1, 1, 3), torch.zeros(1, 3)
    measured = measure_objects(object_coverage(image, white, black)[0, 0])
    return tuple(float(measured[key]) for key in ("area", "centroid_x", "centroid_y", "fill"))


@lru_cache(maxsize=65536)
def _targets_for(prompt: str, image_size: int) -> dict[str, torch.Tensor]:
    """A caption's requests as tensors; object slots past the scene's count are padding (present = 0)."""
    scene = parse_caption(prompt)
    padding = MAX_OBJECTS - len(scene.objects)
    references = [_reference_measurements(spec, image_size) for spec in scene.objects]
    padded_references = references + [(1.0, 0.5, 0.5, 1.0)] * padding
    return {
        "object_rgb": torch.tensor([OBJECT_COLOURS[s.colour] for s in scene.objects] + [(0.0, 0.0, 0.0)] * padding),
        "reference": torch.tensor(padded_references),                       # [K, 4]
        "present": torch.tensor([1.0] * len(scene.objects) + [0.0] * padding),
        "background_rgb": torch.tensor(BACKGROUND_COLOURS[scene.background]),
    }


def _batch_targets(prompts: list[str], image_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    targets = [_targets_for(prompt, image_size) for prompt in prompts]
    return {name: torch.stack([t[name] for t in targets]).to(device, torch.float32) for name in targets[0]}


def _object_terms(measured: dict[str, torch.Tensor], reference: torch.Tensor) -> dict[str, torch.Tensor]:
    """[B, K] each: how right each object's amount of colour, location and shape are, in [0, 1]."""
    area, centroid_x, centroid_y, fill = reference.unbind(dim=-1)
    log_area_ratio = torch.log((measured["area"] + _EPS) / area)
    distance_sq = (measured["centroid_x"] - centroid_x).square() + (measured["centroid_y"] - centroid_y).square()
    return {"amount": torch.exp(-log_area_ratio.square() / (2 * AREA_LOG_TOLERANCE**2)),
            "location": torch.exp(-distance_sq / (2 * LOCATION_TOLERANCE**2)),
            "shape": torch.exp(-(measured["fill"] - fill).square() / (2 * FILL_TOLERANCE**2))}


def _background_score(images: torch.Tensor, background_rgb: torch.Tensor, object_area: torch.Tensor) -> torch.Tensor:
    """Share of the pixels expected to be background that show the requested background colour."""
    distance_sq = (images - background_rgb[:, :, None, None]).square().sum(dim=1)
    background_fraction = _steep_closeness(distance_sq, COLOUR_TOLERANCE).mean(dim=(-2, -1))
    return (background_fraction / (1.0 - object_area).clamp_min(_EPS)).clamp(max=1.0)


def compliance_terms(images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
    """shapes-compliance and the terms it is made of, each [B] in [0, 1]: background, and the
    amount, location and shape terms averaged over the caption's objects.

    What a run's gain is made of (benchmarks/compliance_anatomy.py): a term the seeds of a prompt
    do not differ on cannot be taught by ranking them.
    """
    images = _as_unit_images(images, prompts)
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"shapes images are square, got {tuple(images.shape[-2:])}")
    targets = _batch_targets(prompts, images.shape[-1], images.device)
    coverage = object_coverage(images, targets["object_rgb"], targets["background_rgb"])
    terms = _object_terms(measure_objects(coverage), targets["reference"])
    present = targets["present"]
    per_object = terms["amount"] * (BASE_WEIGHT + LOCATION_WEIGHT * terms["location"] + SHAPE_WEIGHT * terms["shape"])
    objects = (per_object * present).sum(dim=-1) / present.sum(dim=-1)
    object_area = (targets["reference"][..., 0] * present).sum(dim=-1)
    background = _background_score(images, targets["background_rgb"], object_area)
    score = objects * (1.0 - BACKGROUND_WEIGHT + BACKGROUND_WEIGHT * background)
    averaged = {name: (term * present).sum(dim=-1) / present.sum(dim=-1) for name, term in terms.items()}
    return {"compliance": _as_scores(score), "background": background, **averaged}


def shapes_compliance(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """How well each image shows its caption, [B] float32 in [0, 1].

    Per requested object: presence and size (amount of its colour), location (centroid) and
    shape (bounding-box fill), averaged over objects, then scaled by the background's correctness.
    """
    return compliance_terms(images, prompts)["compliance"]


# === aesthetic =============================================================================

_PALETTE_RGB = torch.tensor(sorted(set(PALETTE.values())), dtype=torch.float32)  # [P, 3]


def palette_purity(images: torch.Tensor) -> torch.Tensor:
    """Mean closeness of each pixel to its nearest palette colour, [B].

    Muddy colours, blurred edge ramps and noise move pixels off the palette; a clean render
    loses only its thin anti-aliased outline.
    """
    pixel_sq = images.square().sum(dim=1, keepdim=True)                         # [B, 1, H, W]
    palette = _PALETTE_RGB.to(images.device)
    cross = torch.einsum("bchw,pc->bphw", images, palette)                      # [B, P, H, W]
    palette_sq = palette.square().sum(dim=-1)[None, :, None, None]
    nearest_sq = (pixel_sq - 2 * cross + palette_sq).amin(dim=1).clamp_min(0.0)
    return torch.exp(-nearest_sq / (2 * PURITY_TOLERANCE**2)).mean(dim=(-2, -1))


def flatness(images: torch.Tensor) -> torch.Tensor:
    """1 for flat regions, falling with speckle and noise, [B].

    The median absolute Laplacian ignores the few pixels on real edges and measures the
    texture of the regions that should be flat.
    """
    centre = images[..., 1:-1, 1:-1]
    neighbours = images[..., :-2, 1:-1] + images[..., 2:, 1:-1] + images[..., 1:-1, :-2] + images[..., 1:-1, 2:]
    laplacian = neighbours - 4 * centre   # interior pixels only: the border has no full neighbourhood
    roughness = laplacian.abs().flatten(start_dim=1).median(dim=-1).values
    return torch.exp(-roughness / NOISE_SCALE)


def edge_crispness(images: torch.Tensor) -> torch.Tensor:
    """1 for sharp edges, falling as edges spread over more pixels, [B].

    For an edge of contrast c spread over w pixels, squared differences one pixel apart sum
    to c^2 / w while differences two pixels apart sum to between 2 c^2 (w = 1) and 4 c^2 / w
    (w >> 2). Their ratio measures edge width regardless of contrast, edge length or how many
    objects there are; an image without edges counts as sharp (ratio 2).
    """
    def gradient_energy(step: int) -> torch.Tensor:
        along_x = images[..., :, step:] - images[..., :, :-step]
        along_y = images[..., step:, :] - images[..., :-step, :]
        return along_x.square().sum(dim=(1, 2, 3)) + along_y.square().sum(dim=(1, 2, 3))

    width_ratio = (gradient_energy(2) + 2 * _EPS) / (gradient_energy(1) + _EPS)
    return torch.sigmoid((BLUR_RATIO_MIDPOINT - width_ratio) / BLUR_RATIO_SCALE)


def shapes_aesthetic(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Prompt-independent picture quality, [B] float32 in [0, 1]; prompts only fix the batch size."""
    images = _as_unit_images(images, prompts)
    score = (
        palette_purity(images).clamp_min(_EPS) ** PURITY_WEIGHT
        * flatness(images).clamp_min(_EPS) ** FLATNESS_WEIGHT
        * edge_crispness(images).clamp_min(_EPS) ** CRISPNESS_WEIGHT
    )
    return _as_scores(score)


def _as_unit_images(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [B, 3, H, W], got {tuple(images.shape)}")
    if images.shape[0] != len(prompts):
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    # Samplers overshoot [0, 1] a little; score what a viewer would see.
    return images.detach().to(torch.float32).clamp(0.0, 1.0)


def _as_scores(score: torch.Tensor) -> torch.Tensor:
    # The reward registry's contract: float32 on the CPU, whatever device the images were on.
    return score.clamp(0.0, 1.0).to("cpu", torch.float32)
