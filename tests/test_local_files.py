"""One offline file finder for models and rewards: the same source text searches the same places
(a folder on disk, else the local Hugging Face cache) and is described the same way when missing."""

from __future__ import annotations

import pytest

from solrl_core.local_files import ModelFilesMissing, find_folder, is_repo_id, why_not_found
from solrl_core.models.loading import PipelineModel, resolve_model_dir
from solrl_core.rewards._local import LocalFiles

MODEL = PipelineModel(name="tiny-pipe", pipeline="FluxPipeline", hub_repo="nobody/tiny-pipe",
                      env_var="SOLRL_TEST_TINY_PIPE_PATH", components=("transformer",), tokenizers=(),
                      text_encoders=(), max_sequence_length=8)
REWARD = LocalFiles(reward="tiny-reward", env_var="SOLRL_TEST_TINY_REWARD_PATH", hub_repo="nobody/tiny-reward",
                    required=("model_index.json",))


@pytest.fixture
def hub_cache(monkeypatch, tmp_path):
    """An empty local Hugging Face cache; ``add(repo_id)`` puts a snapshot of a repo in it."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    def add(repo_id: str):
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        snapshot = repo / "snapshots" / ("0" * 40)
        (snapshot / "transformer").mkdir(parents=True)
        (snapshot / "model_index.json").write_text("{}")
        return snapshot

    return add


@pytest.mark.parametrize("source, repo", [
    ("black-forest-labs/FLUX.1-dev", True), ("THUDM/ImageReward", True),
    ("bert-base-uncased", True), ("ImageReward-v1.0", True),  # the Hub's bare (canonical) names
    ("models/flux", True),  # could be either: looked for on disk first, then in the cache
    ("a/b/c", False), ("/abs/dir", False), ("./here", False), ("~/models", False), ("flux/", False),
    ("-flux", False), ("with space", False), ("", False),
])
def test_one_rule_says_which_sources_can_be_hub_repo_ids(source, repo):
    assert is_repo_id(source) is repo
    assert ("not in the local Hugging Face cache" in why_not_found(source)) is repo


@pytest.mark.parametrize("repo_id", ["owner/pipe", "bare-pipe"])
def test_a_model_and_a_reward_find_the_same_cached_repo(hub_cache, tmp_path, monkeypatch, repo_id):
    """Was: a model's source needed exactly one slash, a reward's allowed none; a bare cached name
    was found for a reward and not for a model."""
    snapshot = hub_cache(repo_id)
    monkeypatch.chdir(tmp_path)  # no folder of that name on disk: only the cache can answer
    assert find_folder(repo_id) == snapshot
    assert resolve_model_dir(MODEL, repo_id) == snapshot
    assert REWARD.resolve(repo_id) == snapshot


def test_a_folder_on_disk_wins_over_a_cached_repo_of_the_same_name(hub_cache, tmp_path, monkeypatch):
    hub_cache("owner/pipe")
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "owner" / "pipe"
    (local / "transformer").mkdir(parents=True)
    (local / "model_index.json").write_text("{}")
    assert resolve_model_dir(MODEL, "owner/pipe") == local
    assert REWARD.resolve("owner/pipe") == local


def test_a_file_names_its_folder_for_a_reward_and_is_refused_for_a_model(hub_cache, tmp_path):
    checkpoint = tmp_path / "model_index.json"
    checkpoint.write_text("{}")
    assert REWARD.resolve(str(checkpoint)) == tmp_path
    with pytest.raises(ModelFilesMissing, match=f"{checkpoint} is a file, not a folder"):
        resolve_model_dir(MODEL, str(checkpoint))


@pytest.mark.parametrize("source", ["nobody/absent", "absent-name", "x/y/z"])
def test_missing_files_are_described_alike_for_a_model_and_a_reward(hub_cache, tmp_path, monkeypatch, source):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFilesMissing) as model_error:
        resolve_model_dir(MODEL, source)
    with pytest.raises(ModelFilesMissing) as reward_error:
        REWARD.resolve(source)
    cache_note = ", not in the local Hugging Face cache" if is_repo_id(source) else ""
    assert f"{source} (no folder at {tmp_path / source}{cache_note})" in str(model_error.value)
    assert f"{source} (no file or folder at {tmp_path / source}{cache_note})" in str(reward_error.value)
