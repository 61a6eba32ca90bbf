"""Explorer forward vs full-precision forward, side by side in one process; writes JSON.

    .venv/bin/python benchmarks/explorer_forward.py --out reports/benchmarks/explorer_forward.json

The backends' forwards are interleaved (full, nvfp4, fp8, full, ...) so drift in the machine's load
hits all of them alike; the median of the repeats is reported. On a CPU the quantized backends are
emulated (quantize-dequantize in fp32) and so slower than full precision: the measured ratio is the
emulation's cost. The modeled ratio is what the FLOP accounting charges on the device profile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solrl_core import stages  # noqa: E402
from solrl_core.accounting import DeviceModel, backend_precision, count_flops  # noqa: E402
from solrl_core.config import parse_override  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.models.adapters import OLD, active_adapter  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.quant.explorer import build_explorer  # noqa: E402
from benchmarks._threads import add_threads_option, use_threads  # noqa: E402

BACKENDS = ("emulated-nvfp4", "fp8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="shapes-tiny")
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="reports/benchmarks/explorer_forward.json")
    add_threads_option(parser)
    parser.add_argument("-S", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    use_threads(args)

    config = resolve_config(args.preset, "sol_rl", [parse_override(o) for o in args.overrides] + [("progress", False)])
    state = stages.initial_state(config)
    policy = state.policy
    transformer = policy.transformer
    explorers = {}
    for backend in BACKENDS:
        explorers[backend] = build_explorer(transformer, backend, config.quant.skip, config.quant.min_dim)
        explorers[backend].requantize(transformer, adapter=OLD)
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn((args.batch, *policy.latent_shape), generator=generator).to(policy.device)
    sigma = torch.full((args.batch,), 0.5, device=policy.device)
    conditioning = policy.conditioning([state.train_prompts[i % len(state.train_prompts)] for i in range(args.batch)])

    def forward(backend: str):
        def run():
            with torch.no_grad(), active_adapter(transformer, OLD):
                if backend == "none":
                    policy.velocity(latents, sigma, conditioning)
                else:
                    with explorers[backend].active(transformer):
                        policy.velocity(latents, sigma, conditioning)
        return run

    names = ("none", *BACKENDS)
    for name in names:  # warm-up
        forward(name)()
    timings = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            started = time.perf_counter()
            forward(name)()
            timings[name].append(time.perf_counter() - started)
    seconds = {name: statistics.median(values) for name, values in timings.items()}

    flops = {"none": count_flops(forward("none"))}
    for backend in BACKENDS:
        flops[backend] = count_flops(forward(backend), frozenset(explorers[backend].layer_names))
    modeled = {name: DeviceModel("B200", config.accounting.utilization, backend_precision(name)).hours(
        flops[name], backend_precision(name)) for name in names}
    result = {
        "preset": args.preset, "batch": args.batch, "repeats": args.repeats,
        "device": str(policy.device), "dtype": str(policy.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "quantized_layers": len(explorers[BACKENDS[0]].layer_names),
        "seconds": seconds, "seconds_all": timings,
        "ratio_to_full": {backend: seconds[backend] / seconds["none"] for backend in BACKENDS},
        "flops_per_forward": {name: flops[name].total for name in names},
        "low_precision_flop_share": {backend: flops[backend].low / flops[backend].total for backend in BACKENDS},
        "modeled_ratio_to_full": {backend: modeled[backend] / modeled["none"] for backend in BACKENDS},
        "note": ("Measured on a CPU, where the quantized backends are emulated (quantize-dequantize in fp32): a ratio "
                 "above 1 is the emulation's cost, not the explorer's speed on FP4/FP8 tensor cores. The modeled "
                 "ratio charges the quantized layers' FLOPs at the B200 FP4/FP8 peak and the rest at BF16."),
    }
    out = Path(args.out)
    write_json(out, result)
    print(f"full {seconds['none']:.3f}s  " + "  ".join(
        f"{b} {seconds[b]:.3f}s ({result['ratio_to_full'][b]:.2f}x, modeled {result['modeled_ratio_to_full'][b]:.2f}x)"
        for b in BACKENDS))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
