"""Specifications of the embedded shapes world: scenes, captions, tokens, renderer, rewards."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F

from solrl_core.world.captions import (
    MAX_CAPTION_TOKENS,
    PAD_ID,
    UNK_ID,
    VOCAB,
    caption,
    held_out_prompts,
    is_held_out,
    parse_caption,
    tokenize,
    training_prompts,
)
from solrl_core.world.rewards import compliance_terms, shapes_aesthetic, shapes_compliance
from solrl_core.world.scenes import (
    BACKGROUND_COLOURS,
    OBJECT_COLOURS,
    POSITIONS,
    Scene,
    ShapeSpec,
    cell_centre,
    render,
    sample_scene,
)

REWARDS = [shapes_compliance, shapes_aesthetic]


def sampled_scenes(count: int, seed: int = 0) -> list[Scene]:
    rng = random.Random(seed)
    return [sample_scene(rng) for _ in range(count)]


@pytest.fixture(scope="module")
def eval_prompts() -> list[str]:
    return held_out_prompts(64, seed=3)


@pytest.fixture(scope="module")
def perfect_images(eval_prompts) -> torch.Tensor:
    return render_all([parse_caption(p) for p in eval_prompts])


def render_all(scenes: list[Scene]) -> torch.Tensor:
    return torch.stack([render(scene) for scene in scenes])


def plain_backgrounds(prompts: list[str]) -> torch.Tensor:
    """Each prompt's background colour alone: the canvas before anything is drawn."""
    colours = torch.tensor([BACKGROUND_COLOURS[parse_caption(p).background] for p in prompts])
    return colours[:, :, None, None].expand(-1, 3, 32, 32)


def gaussian_blur(images: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    taps = torch.exp(-torch.arange(-2.0, 3.0).square() / (2 * sigma**2))
    kernel = (taps[:, None] * taps[None]) / taps.sum() ** 2
    flat = images.reshape(-1, 1, *images.shape[-2:])
    return F.conv2d(F.pad(flat, (2, 2, 2, 2), mode="replicate"), kernel[None, None]).reshape(images.shape)


def with_noise(images: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed))
    return (images + sigma * noise).clamp(0.0, 1.0)


def moved_elsewhere(scene: Scene) -> Scene:
    """Each object moved to a grid cell no object of the scene used."""
    free = [p for p in POSITIONS if p not in {o.position for o in scene.objects}]
    return Scene(scene.background, tuple(dataclasses.replace(o, position=p) for o, p in zip(scene.objects, free)))


def recoloured(scene: Scene) -> Scene:
    """Each object given a colour the caption did not ask for (and not the background)."""
    unused = [c for c in OBJECT_COLOURS if c not in {o.colour for o in scene.objects} | {scene.background}]
    return Scene(scene.background, tuple(dataclasses.replace(o, colour=c) for o, c in zip(scene.objects, unused)))


# --- scenes --------------------------------------------------------------------------------


def test_sample_scene_is_deterministic_given_the_rng():
    assert sampled_scenes(50, seed=7) == sampled_scenes(50, seed=7)
    assert sampled_scenes(50, seed=7) != sampled_scenes(50, seed=8)


def test_sampled_scenes_respect_the_world_rules():
    scenes = sampled_scenes(500)
    for scene in scenes:
        assert 1 <= len(scene.objects) <= 2
        assert len({o.position for o in scene.objects}) == len(scene.objects)
        assert all(o.colour != scene.background for o in scene.objects)
    two_object_share = sum(len(s.objects) == 2 for s in scenes) / len(scenes)
    assert 0.2 < two_object_share < 0.4  # two_object_prob defaults to 0.3


def test_max_objects_one_gives_single_object_scenes():
    rng = random.Random(0)
    assert all(len(sample_scene(rng, max_objects=1).objects) == 1 for _ in range(100))


@pytest.mark.parametrize(
    "make_scene",
    [
        lambda: Scene("white", ()),
        lambda: Scene("white", (ShapeSpec("circle", "white", "small", "top"),)),
        lambda: Scene("black", (ShapeSpec("circle", "red", "small", "top"), ShapeSpec("square", "blue", "large", "top"))),
        lambda: Scene("black", (ShapeSpec("hexagon", "red", "small", "top"),)),
        lambda: Scene("pink", (ShapeSpec("circle", "red", "small", "top"),)),
    ],
    ids=["no-objects", "object-is-background", "shared-position", "unknown-shape", "unknown-background"],
)
def test_invalid_scenes_are_refused(make_scene):
    with pytest.raises(ValueError):
        make_scene()


def test_render_is_a_float_image_in_unit_range_and_pure():
    for scene in sampled_scenes(30):
        image = render(scene)
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
        assert image.min() >= 0.0 and image.max() <= 1.0
        assert torch.equal(image, render(scene))
    assert render(sampled_scenes(1)[0], size=48).shape == (3, 48, 48)


def test_render_paints_background_corners_and_object_centres():
    spec = ShapeSpec("square", "red", "large", "bottom right")
    image = render(Scene("gray", (spec,)), size=33)
    assert torch.allclose(image[:, 0, 0], torch.tensor(BACKGROUND_COLOURS["gray"]))
    x, y = cell_centre(spec.position)
    assert torch.allclose(image[:, int(y * 33), int(x * 33)], torch.tensor(OBJECT_COLOURS["red"]))


# --- captions ------------------------------------------------------------------------------


def test_caption_round_trips_through_the_parser_in_every_wording():
    rng = random.Random(1)
    for scene in sampled_scenes(1000):
        assert parse_caption(caption(scene)) == scene
        assert parse_caption(caption(scene, rng)) == scene


def test_canonical_caption_reads_naturally():
    scene = Scene("white", (ShapeSpec("circle", "red", "large", "top left"), ShapeSpec("square", "blue", "small", "center")))
    assert caption(scene) == "a large red circle at the top left and a small blue square in the center on a white background"


def test_parser_tolerates_case_punctuation_and_spacing():
    assert parse_caption("  A Large red CIRCLE at the top left,  on a white background. ") == Scene(
        "white", (ShapeSpec("circle", "red", "large", "top left"),)
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        "a large red circle at the top left",
        "a huge red circle at the top left on a white background",
        "a large pink circle at the top left on a white background",
        "a large red circle at the top left on a purple background",
        "a large red circle somewhere on a white background",
        "a large red circle at the top left and on a white background",
        "a large red circle at the top and a small blue square at the top on a white background",
        "a large white circle at the top on a white background",
    ],
)
def test_parse_caption_refuses_text_outside_the_grammar(text):
    with pytest.raises(ValueError):
        parse_caption(text)


def test_tokenize_pads_with_zero_and_has_the_requested_shape():
    ids = tokenize(["a small red circle in the center on a black background", "one large"], max_len=16)
    assert ids.shape == (2, 16) and ids.dtype == torch.long
    assert (ids[0, :11] != PAD_ID).all() and (ids[0, 11:] == PAD_ID).all()
    assert (ids[1, 2:] == PAD_ID).all()
    assert tokenize(["a b c d e"], max_len=3).shape == (1, 3)
    assert tokenize(["a zebra"], max_len=4)[0, 1] == UNK_ID


def test_vocab_covers_every_caption_and_max_tokens_bounds_them():
    assert VOCAB[PAD_ID] == "<pad>" and VOCAB[UNK_ID] == "<unk>" and len(set(VOCAB)) == len(VOCAB)
    rng = random.Random(2)
    captions = [caption(scene, rng) for scene in sampled_scenes(1000)]
    ids = tokenize(captions, max_len=MAX_CAPTION_TOKENS + 1)
    assert not (ids == UNK_ID).any()
    assert (ids[:, MAX_CAPTION_TOKENS] == PAD_ID).all()
    longest = "one large purple triangle at the bottom right and one large yellow square at the top left against a white background"
    parse_caption(longest)
    assert len(longest.split()) == MAX_CAPTION_TOKENS


# --- prompt sets ---------------------------------------------------------------------------


def test_prompt_sets_are_deterministic_and_distinct():
    assert held_out_prompts(40, seed=0) == held_out_prompts(40, seed=0)
    assert training_prompts(40, seed=0) == training_prompts(40, seed=0)
    assert held_out_prompts(40, seed=0) != held_out_prompts(40, seed=1)
    for prompts in (held_out_prompts(200, seed=0), training_prompts(200, seed=0)):
        assert len(prompts) == 200
        assert len({parse_caption(p) for p in prompts}) == 200


def test_held_out_scenes_are_never_trained_on():
    held_out = {parse_caption(p) for p in held_out_prompts(300, seed=0)}
    trained = {parse_caption(p) for p in training_prompts(3000, seed=0)}
    assert all(is_held_out(s) for s in held_out) and not any(is_held_out(s) for s in trained)
    assert not held_out & trained
    swapped = {Scene(s.background, s.objects[::-1]) for s in held_out}
    assert not swapped & trained  # "A and B" is the same picture as "B and A"


# --- rewards: shared properties ------------------------------------------------------------


@pytest.mark.parametrize("reward", REWARDS)
def test_reward_is_float32_in_unit_range_even_for_wild_inputs(reward, eval_prompts):
    wild = torch.randn(len(eval_prompts), 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 3
    scores = reward(wild, eval_prompts)
    assert scores.shape == (len(eval_prompts),) and scores.dtype == torch.float32
    assert (scores >= 0).all() and (scores <= 1).all()
    assert torch.equal(scores, reward(wild.clamp(0, 1), eval_prompts))  # out-of-range pixels are clamped


@pytest.mark.parametrize("reward", REWARDS)
def test_reward_is_deterministic_and_batch_order_invariant(reward, eval_prompts, perfect_images):
    images = with_noise(perfect_images, 0.05)
    scores = reward(images, eval_prompts)
    assert torch.equal(scores, reward(images.clone(), list(eval_prompts)))
    order = torch.randperm(len(eval_prompts), generator=torch.Generator().manual_seed(1))
    permuted = reward(images[order], [eval_prompts[i] for i in order])
    assert torch.allclose(permuted, scores[order], atol=1e-6)


@pytest.mark.parametrize("reward", REWARDS)
def test_reward_refuses_mismatched_batches(reward, eval_prompts, perfect_images):
    with pytest.raises(ValueError):
        reward(perfect_images, eval_prompts[:-1])
    with pytest.raises(ValueError):
        reward(perfect_images[:, :1], eval_prompts)


# --- rewards: compliance -------------------------------------------------------------------


def test_compliance_is_high_for_a_perfect_render(eval_prompts, perfect_images):
    assert shapes_compliance(perfect_images, eval_prompts).min() >= 0.9


@pytest.mark.parametrize("fill", [0.0, 0.5, 1.0])
def test_compliance_is_low_for_blank_images(fill, eval_prompts, perfect_images):
    blank = torch.full_like(perfect_images, fill)
    assert shapes_compliance(blank, eval_prompts).max() <= 0.2


def test_compliance_is_low_for_a_canvas_of_the_right_background_only(eval_prompts):
    assert shapes_compliance(plain_backgrounds(eval_prompts), eval_prompts).max() <= 0.2


def test_compliance_is_low_for_wrong_colours(eval_prompts):
    wrong = render_all([recoloured(parse_caption(p)) for p in eval_prompts])
    assert shapes_compliance(wrong, eval_prompts).max() <= 0.2


def test_compliance_sits_between_blank_and_perfect_for_the_wrong_place(eval_prompts, perfect_images):
    misplaced = render_all([moved_elsewhere(parse_caption(p)) for p in eval_prompts])
    misplaced_scores = shapes_compliance(misplaced, eval_prompts)
    blank_mean = shapes_compliance(plain_backgrounds(eval_prompts), eval_prompts).mean()
    assert blank_mean + 0.15 < misplaced_scores.mean() < shapes_compliance(perfect_images, eval_prompts).mean() - 0.15
    assert (misplaced_scores < shapes_compliance(perfect_images, eval_prompts)).all()


@pytest.mark.parametrize("attribute, swap", [("size", {"small": "large", "large": "small"}),
                                             ("shape", {"circle": "square", "square": "triangle", "triangle": "circle"})])
def test_compliance_drops_for_the_wrong_size_or_shape(attribute, swap, eval_prompts, perfect_images):
    def altered(scene: Scene) -> Scene:
        return Scene(scene.background, tuple(
            dataclasses.replace(o, **{attribute: swap[getattr(o, attribute)]}) for o in scene.objects))

    wrong = render_all([altered(parse_caption(p)) for p in eval_prompts])
    assert (shapes_compliance(wrong, eval_prompts) < shapes_compliance(perfect_images, eval_prompts) - 0.1).all()


def test_compliance_terms_name_the_defect_a_wrong_render_has(eval_prompts, perfect_images):
    # The terms a run's gain is broken down by: a perfect render scores high on every one, a
    # render with the wrong shape loses its shape term while keeping its background, and one
    # with every object moved elsewhere loses its location term.
    perfect = compliance_terms(perfect_images, eval_prompts)
    assert torch.equal(perfect["compliance"], shapes_compliance(perfect_images, eval_prompts))
    for name in ("background", "amount", "location", "shape"):
        assert perfect[name].min() >= 0.9, name
    swap = {"circle": "square", "square": "triangle", "triangle": "circle"}
    reshaped = render_all([Scene(s.background, tuple(dataclasses.replace(o, shape=swap[o.shape]) for o in s.objects))
                           for s in map(parse_caption, eval_prompts)])
    wrong_shape = compliance_terms(reshaped, eval_prompts)
    assert wrong_shape["shape"].mean() < perfect["shape"].mean() - 0.3
    assert wrong_shape["background"].min() >= 0.9
    misplaced = compliance_terms(render_all([moved_elsewhere(parse_caption(p)) for p in eval_prompts]), eval_prompts)
    assert misplaced["location"].mean() < perfect["location"].mean() - 0.3
    assert misplaced["background"].min() >= 0.9


def test_compliance_is_graded_as_an_object_fades_in(eval_prompts, perfect_images):
    background = plain_backgrounds(eval_prompts)
    means = [shapes_compliance(a * perfect_images + (1 - a) * background, eval_prompts).mean()
             for a in (0.4, 0.6, 0.8, 1.0)]
    assert all(lower < higher for lower, higher in zip(means, means[1:]))


def test_compliance_is_graded_as_objects_slide_away(eval_prompts, perfect_images):
    background = plain_backgrounds(eval_prompts)

    def slid(pixels: int) -> torch.Tensor:
        return torch.cat([background[..., :pixels], perfect_images[..., : 32 - pixels]], dim=-1)

    means = [shapes_compliance(slid(pixels), eval_prompts).mean() for pixels in range(0, 7)]
    assert all(earlier > later for earlier, later in zip(means, means[1:]))
    assert means[1] > means[0] - 0.1  # one pixel off is a small change, not a cliff


def test_compliance_tolerates_faint_noise(eval_prompts, perfect_images):
    assert shapes_compliance(with_noise(perfect_images, 0.01), eval_prompts).mean() >= 0.9


# --- rewards: aesthetic --------------------------------------------------------------------


def test_aesthetic_is_high_for_clean_renders(eval_prompts, perfect_images):
    assert shapes_aesthetic(perfect_images, eval_prompts).min() >= 0.85


def test_aesthetic_is_clearly_lower_with_noise(eval_prompts, perfect_images):
    clean = shapes_aesthetic(perfect_images, eval_prompts)
    noisy = shapes_aesthetic(with_noise(perfect_images, 0.1), eval_prompts)
    assert (noisy < clean - 0.3).all()


def test_aesthetic_is_lower_when_blurred(eval_prompts, perfect_images):
    clean = shapes_aesthetic(perfect_images, eval_prompts)
    assert (shapes_aesthetic(gaussian_blur(perfect_images), eval_prompts) < clean - 0.3).all()


def test_aesthetic_falls_steadily_with_noise_level(eval_prompts, perfect_images):
    means = [shapes_aesthetic(with_noise(perfect_images, sigma), eval_prompts).mean()
             for sigma in (0.0, 0.01, 0.02, 0.05, 0.1)]
    assert all(earlier > later for earlier, later in zip(means, means[1:]))


def test_aesthetic_ignores_the_prompt(eval_prompts, perfect_images):
    other_prompts = eval_prompts[::-1]
    assert torch.equal(shapes_aesthetic(perfect_images, eval_prompts), shapes_aesthetic(perfect_images, other_prompts))
