"""Safe loading: checkpoints only as safetensors, `torch.load` only with `weights_only=True`, paths
from configs resolved and checked before a run starts, services on loopback unless told otherwise."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

import solrl_core.models.registry  # noqa: F401 - imported lazily by the checks; keeps captures clean
import solrl_core.quant.explorer  # noqa: F401
import solrl_core.rewards.registry  # noqa: F401
from flows.cli import main
from solrl_core.config import ConfigError
from solrl_core.models.flux_dev import FLUX_DEV
from solrl_core.presets import resolve_config
from tests._cli_checks import assert_user_error, nothing_runs

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("solrl_core", "tasks", "flows", "benchmarks")
SOURCES = sorted(path for folder in SOURCE_DIRS for path in (ROOT / folder).rglob("*.py"))

# ---------------------------------------------------------------------------------------------
# The scan: every unsafe way of loading or writing weights, found by what a call resolves to

PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
TORCH_LOADS = {"torch.load", "torch.serialization.load"}
TORCH_SAVES = {"torch.save", "torch.serialization.save"}
NUMPY_LOADS = {"numpy.load"}


class UnsafeCalls(ast.NodeVisitor):
    """Collects the problems of one module: names are resolved through its imports, so
    ``import torch as t; t.load(...)`` and ``from torch import load`` count as ``torch.load``."""

    def __init__(self, label: str):
        self.label = label
        self.aliases: dict[str, str] = {}
        self.problems: list[str] = []
        self.safetensors_writers: set[str] = set()

    def _problem(self, node: ast.AST, text: str) -> None:
        self.problems.append(f"{self.label}:{getattr(node, 'lineno', '?')}: {text}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in PICKLE_MODULES:
                self._problem(node, f"imports {alias.name} (pickle can run code; use safetensors)")
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in PICKLE_MODULES:
            self._problem(node, f"imports from {module} (pickle can run code; use safetensors)")
        for alias in node.names:
            full = f"{module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = full
            if module.startswith("safetensors") and alias.name == "save_file":
                self.safetensors_writers.add(alias.asname or alias.name)

    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        name = self.resolve(node.func) or ""
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        unpacked = any(k.arg is None for k in node.keywords)
        if name in TORCH_LOADS:
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True) or unpacked:
                self._problem(node, f"{name}(...) without a literal weights_only=True")
        if name in TORCH_SAVES:
            self._problem(node, f"{name}(...) writes a pickle; write safetensors (safetensors.torch.save_file)")
        if name in NUMPY_LOADS:
            allow = keywords.get("allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                self._problem(node, "numpy.load(..., allow_pickle=...) can unpickle")
        if name.endswith(".save_pretrained") or name.endswith(".from_pretrained"):
            for flag in ("safe_serialization", "use_safetensors"):
                value = keywords.get(flag)
                if value is not None and not (isinstance(value, ast.Constant) and value.value is True):
                    self._problem(node, f"{name}(..., {flag}=...) may read or write pickled weights")
        if name.endswith("save_file") and isinstance(node.func, ast.Name) \
                and node.func.id not in self.safetensors_writers:
            self._problem(node, f"{name}(...) is not safetensors' save_file")
        self.generic_visit(node)


def problems_in(source: str, label: str = "<snippet>") -> list[str]:
    scanner = UnsafeCalls(label)
    scanner.visit(ast.parse(source))
    return scanner.problems


@pytest.mark.parametrize("snippet", [
    "import torch\ntorch.load('a.pt')",
    "import torch\ntorch.load('a.pt', weights_only=False)",
    "import torch\nkw = {}\ntorch.load('a.pt', weights_only=True, **kw)",
    "import torch as th\nth.load('a.pt', map_location='cpu')",
    "from torch import load\nload('a.pt')",
    "from torch import load as fetch\nfetch('a.pt')",
    "import torch.serialization\ntorch.serialization.load('a.pt')",
    "import torch\ntorch.save({}, 'model.pt')",
    "import pickle\npickle.loads(b'')",
    "from joblib import dump",
    "import numpy as np\nnp.load('a.npy', allow_pickle=True)",
    "model.save_pretrained('out', safe_serialization=False)",
    "from somewhere import save_file\nsave_file({}, 'x')",
])
def test_the_scan_finds_each_unsafe_pattern(snippet):
    assert problems_in(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "import torch\ntorch.load('a.pt', map_location='cpu', weights_only=True)",
    "from safetensors.torch import save_file\nsave_file({}, 'x.safetensors')",
    "import json\njson.load(open('a.json'))",
    "model.save_pretrained('out')",
])
def test_the_scan_passes_safe_code(snippet):
    assert problems_in(snippet) == []


def test_no_source_file_loads_or_writes_weights_unsafely():
    assert len(SOURCES) > 20, "the scan found too few files to mean anything"
    problems = [p for path in SOURCES for p in problems_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert problems == [], "\n".join(problems)


def _string_constants(path: Path) -> list[str]:
    """The module's strings; an f-string whole, its fields as {} (f"mlflow ui {uri} --host ...")."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts_of_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    strings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            strings.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts_of_fstrings:
            strings.append(node.value)
    return strings


PICKLED = re.compile(r"\.(pt|pth|bin|ckpt|pkl|pickle|joblib)$")
# Third-party reward checkpoints that only exist as torch pickles; read with weights_only=True.
READ_ONLY_PICKLES = {"solrl_core/rewards/imagereward.py": {"ImageReward.pt"},
                     "solrl_core/rewards/hpsv2.py": {"HPS_v2.1_compressed.pt"}}


def test_the_files_the_code_writes_are_safetensors():
    """Checkpoint names are .safetensors, written with safetensors' save_file; the only pickle names
    anywhere are the two third-party reward checkpoints, which are only read (weights_only=True)."""
    names = {str(path.relative_to(ROOT)): _string_constants(path) for path in SOURCES}
    pickled = {label: {text for text in texts if PICKLED.search(text)} for label, texts in names.items()}
    assert {label: found for label, found in pickled.items() if found} == READ_ONLY_PICKLES
    written = {text for texts in names.values() for text in texts if text.endswith(".safetensors")}
    assert {"lora.safetensors", "eval_images.safetensors", "shapes-tiny.safetensors"} <= written, written
    writers = [path for path in SOURCES if "save_file(" in path.read_text(encoding="utf-8")]
    assert {"solrl_core/training.py", "solrl_core/models/shapes_tiny.py", "solrl_core/compare.py"} <= \
        {str(path.relative_to(ROOT)) for path in writers}


# ---------------------------------------------------------------------------------------------
# Paths from the config: resolved, checked before anything starts, one line when wrong


@pytest.fixture
def run_cli(capsys, tmp_path):
    """`solrl run --out <new dir>` with training stubbed out; returns (code, stdout, stderr)."""
    out = tmp_path / "run-out"

    def invoke(*extra: str, command: str = "run"):
        capsys.readouterr()
        argv = [command, "--out", str(out), *extra] if command == "run" else [command, *extra]
        with nothing_runs():
            code = main(argv)
        captured = capsys.readouterr()
        assert not out.exists(), "an output directory was created by an invalid run"
        return code, captured.out, captured.err

    return invoke


def _tiny_safetensors(path: Path, metadata: dict | None = None) -> Path:
    save_file({"weight": torch.zeros(2)}, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize("kind", ["missing", "folder", "not-safetensors", "no-architecture"])
def test_shapes_tiny_model_path_missing_or_of_the_wrong_kind(run_cli, tmp_path, kind):
    target = tmp_path / "ckpt.safetensors"
    if kind == "folder":
        target.mkdir()
    elif kind == "not-safetensors":
        target.write_bytes(b"\x80\x04not a safetensors header")
    elif kind == "no-architecture":
        _tiny_safetensors(target)
    code, out, err = run_cli("-S", f"model.path={target}")
    expected = {"missing": "does not exist", "folder": "is a folder, not a file",
                "not-safetensors": "is not a safetensors file", "no-architecture": "no architecture"}[kind]
    assert_user_error(code, out, err, "shapes-tiny checkpoint", str(target), expected, "-S model.path=")


def test_a_relative_model_path_is_resolved_against_the_working_directory(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("-S", "model.path=checkpoints/base.safetensors")
    assert_user_error(code, out, err, str(tmp_path / "checkpoints" / "base.safetensors"))


@pytest.mark.parametrize("kind", ["file", "relative-missing", "incomplete"])
def test_real_model_path_missing_or_of_the_wrong_kind(run_cli, tmp_path, monkeypatch, kind):
    monkeypatch.delenv(FLUX_DEV.env_var, raising=False)
    monkeypatch.chdir(tmp_path)
    if kind == "file":
        path, needles = str(_tiny_safetensors(tmp_path / "flux.safetensors")), ["is a file, not a folder"]
    elif kind == "relative-missing":
        path, needles = "models/flux", [str(tmp_path / "models" / "flux")]
    else:
        (tmp_path / "flux").mkdir()
        (tmp_path / "flux" / "model_index.json").write_text("{}")
        path, needles = str(tmp_path / "flux"), ["missing", "transformer/"]
    code, out, err = run_cli("--preset", "flux-imagereward", "-S", f"model.path={path}")
    assert_user_error(code, out, err, "flux.1-dev weights not found", FLUX_DEV.env_var, *needles)


@pytest.mark.parametrize("kind", ["missing", "relative-missing", "wrong-file", "empty-folder"])
def test_reward_paths_missing_or_of_the_wrong_kind(run_cli, tmp_path, monkeypatch, kind):
    monkeypatch.delenv("SOLRL_IMAGEREWARD_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    if kind == "missing":
        path, where = str(tmp_path / "nowhere"), str(tmp_path / "nowhere")
    elif kind == "relative-missing":
        path, where = "rewards/imagereward", str(tmp_path / "rewards" / "imagereward")
    elif kind == "wrong-file":  # a file that is not one of the reward's: its folder lacks them
        (tmp_path / "notes.txt").write_text("x")
        path, where = str(tmp_path / "notes.txt"), str(tmp_path)
    else:
        (tmp_path / "empty").mkdir()
        path, where = str(tmp_path / "empty"), str(tmp_path / "empty")
    code, out, err = run_cli("-S", "rewards={imagereward: 1.0}", "-S", f"reward_paths={{imagereward: {path}}}")
    assert_user_error(code, out, err, "reward 'imagereward'", "ImageReward.pt", where, "reward_paths=")


def test_eval_only_reward_files_are_checked_too(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("SOLRL_PICKSCORE_PATH", raising=False)
    code, out, err = run_cli("-S", "eval.rewards=[shapes-compliance, pickscore]",
                             "-S", f"reward_paths={{pickscore: {tmp_path / 'nope'}}}")
    assert_user_error(code, out, err, "reward 'pickscore'", str(tmp_path / "nope"))


@pytest.mark.parametrize("key", ["prompts.train_file", "prompts.eval_file"])
@pytest.mark.parametrize("kind", ["missing", "folder", "empty", "not-utf8", "relative-missing"])
@pytest.mark.parametrize("command", ["run", "config"])
def test_prompt_files_missing_or_of_the_wrong_kind(run_cli, tmp_path, monkeypatch, key, kind, command):
    """Were: not looked at until the run's first stage (after Prefect started and the output
    directory was made); a non-UTF-8 file was a UnicodeDecodeError traceback."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "prompts.txt"
    expected = {"missing": "no file at", "folder": "is a directory", "empty": "holds no prompts",
                "not-utf8": "is not UTF-8 text", "relative-missing": "no file at"}[kind]
    if kind == "folder":
        target.mkdir()
    elif kind == "empty":
        target.write_text("\n  \n")
    elif kind == "not-utf8":
        target.write_bytes(b"a red circle\n\xff\xfe a blue square\n")
    path = "prompts.txt" if kind == "relative-missing" else str(target)
    code, out, err = run_cli("-S", f"{key}={path}", command=command)
    assert_user_error(code, out, err, key, str(target), expected)


def test_a_relative_prompt_file_is_read_from_the_working_directory(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.txt").write_text("a large red circle at the top left on a white background\n"
                                        "a small blue square in the middle against a black background\n")
    code, out, err = run_cli("-S", "prompts.train_file=train.txt", command="config")
    assert code == 0, err
    assert yaml.safe_load(out)["prompts"]["train_file"] == "train.txt"
    with pytest.raises(ConfigError, match="no file at"):
        monkeypatch.chdir(tmp_path.parent)
        resolve_config("shapes-tiny", "sol_rl", [("prompts.train_file", "train.txt")])


SHAPES_CAPTION = "a large red circle at the top left on a white background"


@pytest.mark.parametrize("key", ["prompts.train_file", "prompts.eval_file"])
@pytest.mark.parametrize("command", ["run", "config"])
def test_a_prompt_line_outside_the_shapes_grammar_is_one_line_before_anything_starts(run_cli, tmp_path, key,
                                                                                     command):
    """Was: accepted, the output directory made, and the run failing after it started ("run failed:
    ValueError: not a shapes caption", exit 1). shapes-tiny's reward reads prompts by the world's
    caption grammar, so the file is parsed by it when the config is resolved."""
    target = tmp_path / "prompts.txt"
    target.write_text(f"{SHAPES_CAPTION}\n\na red circle\x00 on white\n")
    code, out, err = run_cli("-S", f"{key}={target}", command=command)
    assert_user_error(code, out, err, key, f"line 3 of {target}", "shapes-compliance", "not a shapes caption",
                      "\\x00", SHAPES_CAPTION)


def test_real_presets_and_grammar_free_rewards_accept_any_prompt_text(run_cli, tmp_path):
    target = tmp_path / "prompts.txt"
    target.write_text("a red circle\x00 on white\na bowl of ramen, top view\n")
    for arguments in (["--preset", "flux-imagereward"], ["-S", "rewards={shapes-aesthetic: 1.0}",
                                                         "-S", "eval.rewards=[shapes-aesthetic]"]):
        code, out, err = run_cli(*arguments, "-S", f"prompts.train_file={target}", "-S",
                                 f"prompts.eval_file={target}", command="config")
        assert code == 0, err
        assert yaml.safe_load(out)["prompts"]["train_file"] == str(target)


def test_shapes_captions_in_every_surface_form_are_accepted(run_cli, tmp_path):
    target = tmp_path / "prompts.txt"
    target.write_text(f"{SHAPES_CAPTION}\nOne small green triangle in the middle and a large blue square on the "
                      "right against a black background.\n")
    code, out, err = run_cli("-S", f"prompts.train_file={target}", command="config")
    assert code == 0, err


def test_the_paper_presets_prompt_files_exist():
    for preset in ("flux-imagereward", "sana-hpsv2", "sd35l-pickscore"):
        config = resolve_config(preset, "sol_rl")
        assert Path(config.prompts.train_file).is_file() and Path(config.prompts.eval_file).is_file()


# ---------------------------------------------------------------------------------------------
# Services bind to 127.0.0.1 unless the user says otherwise

SERVER_COMMAND = re.compile(r"\b(prefect server start|mlflow (ui|server))\b")
LOOPBACK = "--host 127.0.0.1"


def _readme_without_security_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\n## Security and safe loading\n.*?(?=\n## |\Z)", "\n", text, flags=re.S)


def _server_lines(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")  # shell line continuations
    return [line for line in joined.splitlines() if SERVER_COMMAND.search(line)]


def test_makefile_mlflow_ui_binds_to_loopback():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    recipe = re.search(r"^mlflow-ui:.*\n((?:\t.*\n?)+)", makefile, flags=re.M)
    assert recipe, "no mlflow-ui target in the Makefile"
    commands = _server_lines(recipe.group(1))
    assert commands and all(LOOPBACK in line for line in commands), commands
    assert "0.0.0.0" not in makefile


def test_documented_server_commands_bind_to_loopback():
    for label, text in {"README.md": _readme_without_security_section(),
                        "prefect.yaml": (ROOT / "prefect.yaml").read_text(encoding="utf-8")}.items():
        lines = _server_lines(text)
        assert any("prefect server start" in line for line in lines), f"{label} documents no prefect server"
        assert all(LOOPBACK in line for line in lines), [line for line in lines if LOOPBACK not in line]
        assert "0.0.0.0" not in text, label
    readme_lines = _server_lines(_readme_without_security_section())
    assert any(re.search(r"mlflow (ui|server)", line) for line in readme_lines)


def test_server_commands_of_the_docs_pages_bind_to_loopback():
    pages = sorted((ROOT / "docs").glob("*.md"))
    lines = [line for page in pages for line in _server_lines(page.read_text(encoding="utf-8"))]
    assert any("prefect server start" in line for line in lines), "no docs page documents a prefect server"
    assert all(LOOPBACK in line for line in lines), [line for line in lines if LOOPBACK not in line]
    assert not [page.name for page in pages if "0.0.0.0" in page.read_text(encoding="utf-8")]


def test_server_commands_the_code_prints_bind_to_loopback():
    for path in SOURCES:
        for text in _string_constants(path):
            if SERVER_COMMAND.search(text):
                assert LOOPBACK in text, f"{path.relative_to(ROOT)}: {text!r}"
            assert "0.0.0.0" not in text, f"{path.relative_to(ROOT)}: {text!r}"


def test_prefect_server_default_host_is_loopback():
    from prefect.settings.models.server.api import ServerAPISettings

    assert ServerAPISettings.model_fields["host"].default == "127.0.0.1"


def test_readme_documents_security_and_how_to_expose_a_service():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"\n## Security and safe loading\n(.*?)(?=\n## |\Z)", text, flags=re.S)
    assert section, "README.md has no 'Security and safe loading' section"
    body = section.group(1)
    for needle in ("safetensors", "weights_only=True", "127.0.0.1", "--host 0.0.0.0", "model.path", "reward_paths",
                   "prompts.train_file"):
        assert needle in body, needle
