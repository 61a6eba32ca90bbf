"""`solrl export`, as a user of diffusers or PEFT relies on it: the exported adapter, loaded by those
libraries' own loaders (never ours), makes the transformer compute what `solrl sample` computes
with the same adapter on the same inputs, at the run's LoRA scale; the model card says what the
adapter is; bad input is one line and writes nothing; nothing is uploaded unless asked.

The embedded world's exports come from a real tiny run (conftest's finished_run). FLUX, SANA and
SD3 exports come from a run folder written by the run's own adapter writer over tiny random
instances of those pipelines (training them end to end is test_real_models.py's slow tests'
job), and load into the pipeline itself with ``load_lora_weights``.
"""

from __future__ import annotations

import json
import shutil
import types

import pytest
import torch
from safetensors import safe_open

import _tiny
from _cli_checks import assert_user_error
from solrl_core import cli
from solrl_core.config import to_dict
from solrl_core.ledger import LORA_FILE, SUMMARY_FILE, write_json
from solrl_core.models.adapters import ADAPTERS, EMA, TRAINED, active_adapter, adapter_parameters, attach_adapters
from solrl_core.models.lora_formats import DIFFUSERS_FILE, PEFT_FILES
from solrl_core.models.registry import load_policy
from solrl_core.presets import resolve_config
from solrl_core.sample import load_adapters, read_run
from solrl_core.training import save_adapters

PROMPTS = ["a large red circle at the top left on a white background", "a small blue square on a black background"]
# fp32 on a CPU: the same matmuls in the same order, so equal to rounding at most.
TOLERANCE = 1e-5


def export(capsys, run, *argv) -> tuple[int, str, str]:
    code = cli.main(["export", str(run), *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def inputs(policy, seed: int = 0):
    """Latents, noise levels and conditioning of two samples, as the samplers pass them."""
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(2, *policy.latent_shape, generator=generator)
    return latents, torch.tensor([0.8, 0.35]), policy.conditioning(PROMPTS)


def sample_output(run_dir, adapter: str, latents, sigma, conditioning_of) -> torch.Tensor:
    """The transformer's output under ``adapter`` as `solrl sample` sets it up (its own loading)."""
    run = read_run(run_dir)
    policy = load_policy(run.config)
    load_adapters(policy, run)
    with torch.no_grad(), active_adapter(policy.transformer, {"ema": EMA, "default": TRAINED}[adapter]):
        return policy.velocity(latents, sigma, conditioning_of(policy))


def base_output(config, latents, sigma, conditioning_of) -> torch.Tensor:
    policy = load_policy(config)
    with torch.no_grad():
        return policy.velocity(latents, sigma, conditioning_of(policy))


def outside_output(config, transformer, latents, sigma, conditioning_of) -> torch.Tensor:
    """``transformer`` (adapted by diffusers or PEFT) called as the run's policy calls its own."""
    policy = load_policy(config)
    with torch.no_grad():
        return policy.forward(transformer, latents.to(policy.dtype), sigma, conditioning_of(policy)).float()


def largest_difference(name: str, found: torch.Tensor, expected: torch.Tensor) -> float:
    difference = (found - expected).abs().max().item()
    print(f"{name}: largest output difference {difference:.3e}")
    return difference


def conditioning_of(policy):
    return policy.conditioning(PROMPTS)


# ---------------------------------------------------------------------------------------------
# The embedded world: a real run's adapters


@pytest.mark.parametrize("adapter", ["ema", "default"])
def test_diffusers_export_loads_with_load_lora_adapter_and_computes_what_sample_computes(capsys, finished_run,
                                                                                        tmp_path, adapter):
    code, out, _ = export(capsys, finished_run, "--format", "diffusers", "--adapter", adapter, "--out", tmp_path / "d")
    assert code == 0 and DIFFUSERS_FILE in out
    assert sorted(path.name for path in (tmp_path / "d").iterdir()) == ["README.md", DIFFUSERS_FILE]
    run = read_run(finished_run)
    lora = run.config.train.lora
    with safe_open(str(tmp_path / "d" / DIFFUSERS_FILE), framework="pt") as handle:
        keys, metadata = list(handle.keys()), handle.metadata()
    print(f"{DIFFUSERS_FILE}: {len(keys)} tensors, e.g. {keys[:2]}; metadata {metadata}")
    assert len(keys) == len([key for key in run.tensors if key.startswith(f"{adapter}/")])
    assert all(key.startswith("transformer.") and key.endswith((".lora_A.weight", ".lora_B.weight")) for key in keys)

    policy = load_policy(run.config)
    # diffusers' loader, as the card says to call it: the folder and the file name
    policy.transformer.load_lora_adapter(str(tmp_path / "d"), weight_name=DIFFUSERS_FILE, prefix="transformer",
                                         adapter_name="solrl")
    restored = policy.transformer.peft_config["solrl"]
    assert (restored.r, restored.lora_alpha) == (lora.rank, lora.alpha) and lora.alpha != lora.rank  # scale 2, not 1
    latents, sigma, _ = inputs(policy)
    with torch.no_grad():
        found = policy.velocity(latents, sigma, policy.conditioning(PROMPTS))
    expected = sample_output(finished_run, adapter, latents, sigma, conditioning_of)
    assert largest_difference(f"shapes-tiny diffusers {adapter}", found, expected) <= TOLERANCE
    # The adapter matters: equal to `solrl sample` is not equal to the base model.
    assert (expected - base_output(run.config, latents, sigma, conditioning_of)).abs().max() > 100 * TOLERANCE


def test_peft_export_loads_with_peft_from_pretrained_and_computes_what_sample_computes(capsys, finished_run,
                                                                                      tmp_path):
    from peft import PeftModel

    code, _, _ = export(capsys, finished_run, "--format", "peft", "--out", tmp_path / "p")
    assert code == 0
    assert sorted(path.name for path in (tmp_path / "p").iterdir()) == sorted(["README.md", *PEFT_FILES])
    run = read_run(finished_run)
    config = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    with safe_open(str(tmp_path / "p" / PEFT_FILES[1]), framework="pt") as handle:
        print(f"{PEFT_FILES[1]}: e.g. {list(handle.keys())[:2]}; adapter_config.json {config}")
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == \
        (run.config.train.lora.rank, run.config.train.lora.alpha, sorted(run.config.train.lora.targets))

    policy = load_policy(run.config)
    model = PeftModel.from_pretrained(policy.transformer, str(tmp_path / "p"))
    latents, sigma, _ = inputs(policy, seed=1)
    found = outside_output(run.config, model, latents, sigma, conditioning_of)
    expected = sample_output(finished_run, "ema", latents, sigma, conditioning_of)
    assert largest_difference("shapes-tiny peft ema", found, expected) <= TOLERANCE


def test_the_model_card_says_what_the_adapter_is_and_how_to_load_it(capsys, finished_run, tmp_path):
    export(capsys, finished_run, "--format", "diffusers", "--out", tmp_path / "d")
    card = (tmp_path / "d" / "README.md").read_text()
    summary = json.loads((finished_run / SUMMARY_FILE).read_text())
    lora = read_run(finished_run).config.train.lora
    for part in ("shapes-tiny / sol_rl", f"| iterations | {summary['iterations']} |", "| adapter | ema",
                 f"rank {lora.rank}, alpha {lora.alpha} (scale {lora.alpha / lora.rank:g})",
                 "load_lora_adapter(", "solrl sample"):
        assert part in card, part
    for name, value in summary["eval_reward_final"].items():
        assert f"| {name} (held-out) | base {summary['eval_reward_base'][name]:.4f}, final {value:.4f} |" in card


def test_nothing_is_uploaded_unless_asked(capsys, finished_run, tmp_path, monkeypatch):
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("an export without --push-to-hub reached the Hub")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", refuse)
    code, out, _ = export(capsys, finished_run, "--format", "peft", "--out", tmp_path / "p")
    assert code == 0 and "uploaded to" not in out


@pytest.mark.parametrize("case", ["not a run folder", "damaged adapter file", "unknown adapter name",
                                  "unknown format", "out holds files", "push while offline"])
def test_bad_input_is_one_line_and_writes_nothing(capsys, finished_run, tmp_path, monkeypatch, case):
    run, out, extra = finished_run, tmp_path / "out", ["--format", "diffusers"]
    if case == "not a run folder":
        run = tmp_path / "empty"
        run.mkdir()
    elif case == "damaged adapter file":
        run = tmp_path / "damaged"
        shutil.copytree(finished_run, run)
        data = bytearray((run / LORA_FILE).read_bytes())
        data[-8] ^= 0x01  # one flipped bit in the tensor data: the header still reads
        (run / LORA_FILE).write_bytes(bytes(data))
    elif case == "unknown adapter name":
        extra += ["--adapter", "old-ema"]
    elif case == "unknown format":
        extra = ["--format", "ckpt"]
    elif case == "out holds files":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        extra += ["--push-to-hub", "someone/solrl-adapter"]
    code, stdout, err = export(capsys, run, *extra, "--out", out)
    assert_user_error(code, stdout, err)
    if case == "out holds files":
        assert [path.name for path in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()


# ---------------------------------------------------------------------------------------------
# FLUX, SANA, SD3: into the pipeline with load_lora_weights

PIPELINES = {"flux-imagereward": (_tiny.save_flux, "FluxPipeline"),
             "sana-hpsv2": (_tiny.save_sana, "SanaPipeline"),
             "sd35l-pickscore": (_tiny.save_sd3, "StableDiffusion3Pipeline")}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-pipelines")


def adapted_run(preset: str, model_dir, run_dir):
    """A run folder holding adapters over the tiny model, written by the run's own writer, with
    every adapter set to its own random values (a trained LoRA's B is not zero)."""
    config = resolve_config(preset, "sol_rl", [("model.path", str(model_dir)), ("model.resolution", 16),
                                               ("train.lora.rank", 4), ("train.lora.alpha", 8), ("iterations", 1)])
    policy = load_policy(config)
    lora = config.train.lora
    attach_adapters(policy.transformer, lora.rank, lora.alpha, lora.targets, seed=config.seed)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name in ADAPTERS:
            for parameter in adapter_parameters(policy.transformer, name).values():
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    run_dir.mkdir(parents=True)
    save_adapters(run_dir / LORA_FILE, types.SimpleNamespace(policy=policy, config=config))
    write_json(run_dir / SUMMARY_FILE, {"config": to_dict(config), "iterations": 1, "eval_reward_base": {},
                                        "eval_reward_final": {}})
    return config


@pytest.mark.parametrize("preset", list(PIPELINES))
def test_real_model_exports_load_into_the_pipeline_and_peft_and_compute_what_sample_computes(capsys, preset,
                                                                                            tiny_models, tmp_path):
    import diffusers
    from peft import PeftModel

    save, pipeline_class = PIPELINES[preset]
    model_dir = tiny_models / preset
    if not model_dir.exists():
        save(model_dir)
    run_dir = tmp_path / "run"
    config = adapted_run(preset, model_dir, run_dir)
    for fmt in ("diffusers", "peft"):
        assert export(capsys, run_dir, "--format", fmt, "--out", tmp_path / fmt)[0] == 0
    policy = load_policy(config)
    latents, sigma, _ = inputs(policy)
    expected = sample_output(run_dir, "ema", latents, sigma, conditioning_of)

    pipe = getattr(diffusers, pipeline_class).from_pretrained(str(model_dir))
    pipe.load_lora_weights(str(tmp_path / "diffusers"))
    assert pipe.transformer.peft_config["default_0"].lora_alpha == config.train.lora.alpha
    found = outside_output(config, pipe.transformer, latents, sigma, conditioning_of)
    assert largest_difference(f"{preset} diffusers", found, expected) <= TOLERANCE

    model = PeftModel.from_pretrained(load_policy(config).transformer, str(tmp_path / "peft"))
    found = outside_output(config, model, latents, sigma, conditioning_of)
    assert largest_difference(f"{preset} peft", found, expected) <= TOLERANCE
    assert (expected - base_output(config, latents, sigma, conditioning_of)).abs().max() > 100 * TOLERANCE
