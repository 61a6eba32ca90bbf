"""The prepared GPU check (benchmarks/gpu_check.py): its rehearsal runs every section of the GPU run
on this CPU with the GPU run's architectures (reduced only in depth, batch and tokens), so no shape
or dtype error can first meet the GPU; a section that raises is recorded and the next one runs."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _check_harness as harness  # noqa: E402
from benchmarks import gpu_check  # noqa: E402
from solrl_core.models.memory import FLUX_DEV_CONFIG  # noqa: E402
from solrl_core.models.shapes_tiny import TinyArchitecture, build_transformer, rope_axes  # noqa: E402

STAGES = {"quantize", "explore", "rank", "regenerate", "update", "requantize"}


def test_rope_axes_derive_from_the_head_dim():
    # FLUX.1-dev's own axes, and the committed shapes-tiny checkpoint's (head dim 16).
    assert rope_axes(FLUX_DEV_CONFIG["attention_head_dim"]) == tuple(FLUX_DEV_CONFIG["axes_dims_rope"])
    assert rope_axes(16) == (4, 6, 6)
    for head_dim in (32, 64, 128):
        assert sum(rope_axes(head_dim)) == head_dim
    with pytest.raises(ValueError, match="even rotary axes"):
        rope_axes(24)


def test_the_mid_size_model_of_head_dim_64_runs_a_forward():
    """The GPU check's iteration model: with RoPE axes hard-coded for head dim 16 its first forward
    raised 'The size of tensor a (64) must match the size of tensor b (16)'."""
    arch = TinyArchitecture(**{**gpu_check.MID_SIZE, "image_size": 16, "num_layers": 1, "num_single_layers": 1})
    transformer = build_transformer(arch)
    assert transformer.config.axes_dims_rope == rope_axes(64)
    from solrl_core.models.flux import image_token_ids

    tokens = arch.grid**2
    out = transformer(hidden_states=torch.randn(1, tokens, arch.token_channels),
                      encoder_hidden_states=torch.randn(1, 3, arch.text_dim), pooled_projections=torch.randn(1, arch.text_dim),
                      timestep=torch.full((1,), 0.5), img_ids=image_token_ids(arch.grid, arch.grid),
                      txt_ids=torch.zeros(3, 3), return_dict=False)[0]
    assert out.shape == (1, tokens, arch.token_channels)


def test_the_rehearsal_keeps_the_gpu_runs_widths():
    # Only depth, batch and tokens are reduced: every other field of the two scales is the same.
    reduced = {"name", "layer_tokens", "repeats", "warmup", "depth", "batch", "image_side", "text_tokens",
               "transformer_backends", "iteration_settings"}
    for field in set(gpu_check.Scale.__dataclass_fields__) - reduced - {"iteration_architecture"}:
        assert getattr(gpu_check.REHEARSAL, field) == getattr(gpu_check.GPU, field)
    widths = {"attention_head_dim", "num_attention_heads", "text_dim", "text_heads", "patch"}
    for key in widths:
        assert gpu_check.REHEARSAL.iteration_architecture[key] == gpu_check.GPU.iteration_architecture[key]
    assert {shape["K"] for shape in gpu_check.quantized_shapes("flux")} == {3072, 12288, 15360}


def test_a_section_that_raises_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch, capsys):
    def broken():
        raise RuntimeError("The size of tensor a (64) must match the size of tensor b (16)")

    saved = []
    monkeypatch.setattr(gpu_check, "sections", lambda *args: [("broken", broken), ("fine", lambda: {"x": 1})])
    monkeypatch.setattr("solrl_core.ledger.write_json",
                        lambda path, report: saved.append(json.loads(json.dumps(report, default=str))))
    assert gpu_check.main(["--rehearse", "--out", str(tmp_path / "check.json")]) == 1
    after_broken = next(report for report in saved if "broken" in report.get("sections", {}))
    assert "fine" not in after_broken["sections"]  # saved after the broken section, before the next
    broken_record, fine = saved[-1]["sections"]["broken"], saved[-1]["sections"]["fine"]
    assert broken_record["status"] == "error" and "must match" in broken_record["error"]
    assert "RuntimeError" in broken_record["traceback"] and "def broken" not in broken_record["error"]
    assert fine == {"status": "ok", "result": {"x": 1}, "seconds": fine["seconds"]}
    assert all(v["verdict"].startswith("not measured") for v in saved[-1]["verdicts"])


def test_a_missing_required_package_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(harness.REQUIRED_PACKAGES, "no-such-package", "no_such_package_solrl")
    assert gpu_check.main(["--rehearse", "--out", str(tmp_path / "check.json")]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("gpu_check: cannot start: missing required package(s) no-such-package")
    assert "no-such-package absent" in lines[0] and "transformer-engine" in lines[0]
    assert not (tmp_path / "check.json").exists()


def test_verdicts_judge_only_on_the_gpu():
    report = {"environment": {"gpu_memory_gib": 80.0}, "sections": {
        "layers_flux": {"status": "ok", "result": {"layers": [
            {"tflops": {"bf16_linear": 600.0}, "speedup_vs_bf16": {"fp8_gemm": 1.8, "fp8_layer": 1.4,
                                                                  "nvfp4_emulated_layer": 0.9}}]}},
        "transformer": {"status": "error", "error": "x", "traceback": "x"}}}
    judged = {v["goal"]: v["verdict"] for v in gpu_check.verdicts(report, judged=True)}
    assert judged["bf16 sanity"] == "pass" and judged["fp8 gemm"] == "pass" and judged["fp8 layer"] == "FAIL"
    assert judged["fp8 transformer"].startswith("not measured")
    rehearsed = {v["goal"]: v["verdict"] for v in gpu_check.verdicts(report, judged=False)}
    assert rehearsed["fp8 layer"] == "rehearsal: not judged"


def test_te_token_rule_names_the_batch_that_works():
    rule = gpu_check.te_token_rule(batch=2)
    assert not rule["sana.caption"]["ok"] and rule["sana.caption"]["batch_multiple"] == 4
    assert rule["flux.text"]["ok"] and gpu_check.te_token_rule(batch=4)["sana.caption"]["ok"]


def test_the_rehearsal_runs_every_section_of_the_gpu_check(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--rehearse", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == "rehearsal" and report["explorer_target"] == "fp8"  # what auto picks on an H100
    assert set(report["sections"]) == {"layers_flux", "layers_sana", "layers_sd3", "transformer", "iteration"}
    assert all(record["status"] == "ok" for record in report["sections"].values())
    paths = {"bf16_linear", "fp8_gemm", "fp8_layer", "fp8_rowwise_layer", "nvfp4_emulated_layer"}
    for model in ("flux", "sana", "sd3"):
        for layer in report["sections"][f"layers_{model}"]["result"]["layers"]:
            assert set(layer["ms"]) == paths and all(layer["kernels"][path] for path in paths)
            assert "aten::_scaled_mm" in layer["kernels"]["fp8_gemm"]  # the GPU's GEMM, not its emulation
            # The GEMMs agree with their emulations up to the bf16 output's rounding.
            assert all(error < 0.01 for error in layer["relative_error_vs_emulation"].values())
    transformer = report["sections"]["transformer"]["result"]
    assert transformer["config"]["attention_head_dim"] == 128 and transformer["config"]["axes_dims_rope"] == [16, 56, 56]
    assert transformer["config"]["num_attention_heads"] == FLUX_DEV_CONFIG["num_attention_heads"]
    assert "compiled per block" in transformer["bf16"]
    fp8 = transformer["variants"]["fp8"]
    assert fp8["mode"] == "compiled per block" and 0 < fp8["relative_error_vs_bf16"] < 0.2
    assert "skipped" in transformer["variants"]["te-nvfp4"]
    iteration = report["sections"]["iteration"]["result"]
    assert set(iteration["seconds"]) == STAGES and iteration["dtype"] == "torch.bfloat16"
    assert iteration["architecture"]["attention_head_dim"] == 64
    assert iteration["quantize"]["backend"] == "fp8" and iteration["quantize"]["quantized_layers"] > 0
    assert {v["verdict"] for v in report["verdicts"]} <= {"rehearsal: not judged"} | {
        v["verdict"] for v in report["verdicts"] if v["verdict"].startswith("not measured")}
    assert not any(v["verdict"] in ("pass", "FAIL") for v in report["verdicts"])
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_a_run_without_a_compile_toolchain_quantizes_eager_with_one_warning(monkeypatch, capsys):
    """The explorer's compiled quantizers fall back to eager (the same codes) where torch.compile
    cannot build kernels, warning once per process instead of failing the run at the first layer."""
    from solrl_core.quant import fp8, gpu_path

    monkeypatch.setattr(gpu_path.shutil, "which", lambda name: None)
    gpu_path.compile_toolchain_problem.cache_clear()
    try:
        quantize = gpu_path.compile_quantizer(fp8.quantize_fp8, fullgraph=True)
        x = torch.randn(8, 32, dtype=torch.bfloat16)
        first, second = quantize(x), quantize(2 * x)
        expected = fp8.quantize_fp8(x)
        assert torch.equal(first.data.view(torch.uint8), expected.data.view(torch.uint8))
        assert torch.equal(first.scale, expected.scale) and torch.equal(second.scale, 2 * expected.scale)
        warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "no C compiler" in warnings[0] and "eager" in warnings[0]
    finally:
        gpu_path.compile_toolchain_problem.cache_clear()
