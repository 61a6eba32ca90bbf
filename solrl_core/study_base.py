"""The DVC study's base stage (`solrl study base`): the file every run stage depends on.

params.yaml's ``base`` names it. The embedded world pretrains its checkpoint there (the file is
``settings.model.path``; the stage reruns only when the world's code changes). A real model is
not made by the study: the stage checks that its local files and the rewards' are there (one line
naming what is missing, exit code 2) and writes ``base``, a manifest of the model folder. DVC then
hashes this small file for the run stages, not a model folder of tens of GB at every `dvc repro`;
a run stage reruns when the manifest changes.

The manifest lists every file of the model folder (hidden ones, such as a download tool's
``.cache/``, left out) by its path inside the folder, its size and a SHA-256: of the whole file
up to WHOLE_FILE_BYTES, else of its first and last SAMPLE_BYTES, so that a repro reads a few MiB
per weight file. It names no absolute path and no time: the same model copied to another folder
or machine gives the same manifest, so moving it reruns nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from solrl_core.config import ConfigError, ModelConfig
from solrl_core.ledger import write_json
from solrl_core.local_files import local_path
from solrl_core.study import Study, family_config
from solrl_core.world import SHAPES_TINY_CHECKPOINT

EMBEDDED_LOADER = "shapes-tiny"
WHOLE_FILE_BYTES = 64 << 20  # configs, tokenizers, schedulers: digested whole
SAMPLE_BYTES = 1 << 20  # of each end of a larger (weight) file
MANIFEST_VERSION = 1


def make_base(study: Study, overwrite_packaged: bool = False, log=print) -> Path:
    """The embedded world's checkpoint pretrained, or a real model's files checked and listed."""
    configs = {name: family_config(study, name) for name in study.families}
    model = one_model(configs)
    if model.loader == EMBEDDED_LOADER:
        return pretrain_base(study, model, overwrite_packaged)
    return write_manifest(study, configs, log)


def one_model(configs: dict) -> ModelConfig:
    """The study has one base: every family trains the same model."""
    (first, config), *others = configs.items()
    for name, other in others:
        if (other.model.loader, other.model.path) != (config.model.loader, config.model.path):
            raise ConfigError(f"params.yaml: families.{name} trains another model than families.{first} "
                              f"({other.model.loader} {other.model.path!r} against {config.model.loader} "
                              f"{config.model.path!r}); the study has one base: set model under settings")
    return config.model


def pretrain_base(study: Study, model: ModelConfig, overwrite_packaged: bool) -> Path:
    checkpoint = (local_path(model.path) if model.path else SHAPES_TINY_CHECKPOINT.resolve())
    base = local_path(study.base) if study.base else checkpoint
    if base != checkpoint:
        raise ConfigError(f"params.yaml: base ({study.base}) must be the checkpoint settings.model.path names "
                          f"({model.path or SHAPES_TINY_CHECKPOINT}): the embedded world's base stage pretrains it")
    if base == SHAPES_TINY_CHECKPOINT.resolve() and not overwrite_packaged:
        raise ConfigError(f"params.yaml: base {study.base} is the packaged base checkpoint, which every "
                          f"embedded-world run starts from; rebuilding it takes minutes: give --overwrite-packaged "
                          f"(dvc.yaml's base stage does, when the world's code changed)")
    # deferred: diffusers at import time (start-up of a real model's base stage)
    from solrl_core.world.pretrain import PretrainError, PretrainSettings, pretrain

    try:
        record = pretrain(base, PretrainSettings())
    except PretrainError as error:
        raise ConfigError(str(error)) from None
    print(f"pretrained in {record['seconds']}s, final loss {record['final_loss']:.4f}; wrote {base}")
    return base


def write_manifest(study: Study, configs: dict, log) -> Path:
    """Check the model's and every reward's files (ModelFilesMissing names what is missing), then
    write the manifest of the model folder to ``study.base``."""
    # deferred: diffusers and transformers at import time (start-up of the embedded world's base stage)
    from solrl_core.models.registry import check_model_files
    from solrl_core.rewards.registry import check_reward_files

    config = next(iter(configs.values()))
    folder = check_model_files(config.model)
    for each in configs.values():
        check_reward_files(list(each.rewards) + list(each.eval.rewards), each.reward_paths)
    base = manifest_path(study, folder)
    files = [file_entry(folder, path) for path in model_files(folder)]
    manifest = {"version": MANIFEST_VERSION, "preset": study.preset, "loader": config.model.loader,
                "model_index": _model_index(folder), "files": files}
    write_json(base, manifest)
    size = sum(entry["bytes"] for entry in files)
    log(f"base: {config.model.loader} files in {folder} are there ({len(files)} files, {size / 1e9:.2f} GB); "
        f"wrote {base}")
    return base


def manifest_path(study: Study, folder: Path) -> Path:
    if not study.base:
        raise ConfigError("params.yaml: base: name the manifest the base stage writes for a real model, "
                          "e.g. base: reports/pipeline/base.json")
    base = local_path(study.base)
    if base is None or base.suffix != ".json":
        raise ConfigError(f"params.yaml: base ({study.base}): for a real model, a .json file for the manifest of "
                          f"its files, e.g. reports/pipeline/base.json")
    if base.is_relative_to(folder.resolve()):
        raise ConfigError(f"params.yaml: base ({study.base}) is inside the model folder {folder}; "
                          f"give a file outside it, e.g. reports/pipeline/base.json")
    return base


def model_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (symbolic links followed, as in a Hugging Face cache snapshot),
    in path order; hidden files and folders are not the model's (a download tool's state)."""
    return sorted(path for path in folder.rglob("*")
                  if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts))


def file_entry(folder: Path, path: Path) -> dict:
    size = path.stat().st_size
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            if size <= WHOLE_FILE_BYTES:
                for chunk in iter(lambda: handle.read(SAMPLE_BYTES), b""):
                    digest.update(chunk)
            else:
                digest.update(handle.read(SAMPLE_BYTES))
                handle.seek(size - SAMPLE_BYTES)
                digest.update(handle.read(SAMPLE_BYTES))
    except OSError as error:
        raise ConfigError(f"base: cannot read {path} ({error.strerror or error})") from None
    return {"path": path.relative_to(folder).as_posix(), "bytes": size, "sha256": digest.hexdigest(),
            "digest_of": "whole file" if size <= WHOLE_FILE_BYTES else f"first and last {SAMPLE_BYTES >> 20} MiB"}


def _model_index(folder: Path) -> dict:
    """model_index.json (the pipeline's class and components), for a reader of the manifest."""
    try:
        return json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"base: {folder / 'model_index.json'} is not a JSON file ({error})") from None
