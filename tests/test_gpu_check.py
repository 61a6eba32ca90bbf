"""The prepared GPU check (benchmarks/gpu_check.py) runs end to end with --smoke on this CPU, so the
script that goes to the GPU machine has run its code paths before it gets there."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import gpu_check  # noqa: E402


def test_gpu_check_smoke_writes_one_json_with_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["smoke"] and report["auto_backend"] == "emulated-nvfp4"  # a CPU
    paths = {"bf16_linear", "fp8_explorer", "fp8_prequantized_scaled_mm", "nvfp4_emulated"}
    for layer in report["layers"]:
        assert set(layer["ms"]) == paths and all(layer["kernels"][path] for path in paths)
    transformer = report["transformer"]
    assert transformer["ms"]["bf16"] > 0 and transformer["ms"]["fp8"] > 0 and transformer["ms"]["emulated-nvfp4"] > 0
    assert transformer["relative_error_vs_bf16"]["fp8"] < transformer["relative_error_vs_bf16"]["emulated-nvfp4"] < 0.5
    iteration = report["iteration"]
    assert set(iteration["seconds"]) == {"quantize", "explore", "rank", "regenerate", "update", "requantize"}
    assert iteration["quantize"]["backend"] == "emulated-nvfp4" and iteration["quantize"]["quantized_layers"] > 0
    assert not list(tmp_path.glob("*.tmp"))  # written atomically
