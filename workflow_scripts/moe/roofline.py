"""Roofline verdict for the fused-MoE expert GEMMs: can kernel tuning help at this batch size at all?

At M tokens with top-k routing over E experts, a layer does 6·M·k·H·N FLOPs (gate/up and down GEMMs)
but must read the weights of every expert that got a token: E·(1-(1-k/E)^M) of them in expectation
under uniform routing, 3·H·N weights each. Their ratio, the arithmetic intensity, below the device's
ridge point (peak FLOP/s ÷ memory bandwidth) means the layer waits on memory, and a better tile
config cannot make memory faster: "memory-bound: tuning can't help much". That is the article's
E=256, N=256 verdict, predicted here from shapes before anything is measured.

CLI: python -m workflow_scripts.moe.roofline --model DIR --batch-sizes ... --engine embedded|sglang
     [--tp-size T --ep-size P] [--device-name X | --device-from merged.json] [--peak-tflops F --mem-bw-gbs B]
     --out roofline.csv --plot roofline.svg
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workflow_scripts.io import atomic_write_text
from workflow_scripts.moe.model_shapes import MoeShape, read_moe_shape

MEMORY_BOUND = "memory-bound: tuning can't help much"
COMPUTE_BOUND = "compute-bound: tuning can help"

# Dense (no sparsity) tensor-core peaks and memory bandwidth from vendor datasheets; approximate, and
# overridable with moe.device.{peak_tflops, mem_bw_gbs}. First match (case-insensitive substring) wins.
KNOWN_DEVICES: list[tuple[str, dict]] = [
    ("H100 PCIe", {"bf16_tflops": 756, "fp8_tflops": 1513, "mem_bw_gbs": 2000}),
    ("H100", {"bf16_tflops": 989, "fp8_tflops": 1979, "mem_bw_gbs": 3350}),
    ("H200", {"bf16_tflops": 989, "fp8_tflops": 1979, "mem_bw_gbs": 4800}),
    ("B200", {"bf16_tflops": 2250, "fp8_tflops": 4500, "mem_bw_gbs": 8000}),
    # 4 PFLOPS FP4 with sparsity -> ~1000 FP8 / ~500 BF16 dense; 512-bit GDDR7 at 28 Gbps
    ("RTX PRO 6000 Blackwell", {"bf16_tflops": 500, "fp8_tflops": 1000, "mem_bw_gbs": 1792}),
    ("A100", {"bf16_tflops": 312, "fp8_tflops": None, "mem_bw_gbs": 2039}),
    ("L40S", {"bf16_tflops": 362, "fp8_tflops": 733, "mem_bw_gbs": 864}),
]
_FP8_COMPUTE = ("fp8_w8a8", "int8_w8a8")  # weight-only quantization computes in bf16


@dataclass(frozen=True)
class Device:
    """What bounds a kernel on one device."""

    name: str
    peak_tflops: float
    mem_bw_gbs: float
    source: str  # "datasheet table", "config", "measured on this CPU", or a mix

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which the device is compute-bound."""
        return self.peak_tflops * 1e12 / (self.mem_bw_gbs * 1e9)


def known_device(name: str, shape: MoeShape) -> Device | None:
    """The table entry for a GPU name (spaces or underscores), at the peak for the layer's compute dtype."""
    label = name.replace("_", " ").lower()
    for key, spec in KNOWN_DEVICES:
        if key.lower() in label:
            fp8 = shape.kernel_dtype in _FP8_COMPUTE and spec["fp8_tflops"]
            peak = spec["fp8_tflops"] if fp8 else spec["bf16_tflops"]
            return Device(name, peak, spec["mem_bw_gbs"], "datasheet table")
    return None


def measure_cpu(dtype: str = "float32", seconds: float = 1.0) -> tuple[float, float]:
    """(peak TFLOP/s from a square matmul, bandwidth GB/s from a large copy) on this CPU, best of a few runs."""
    import torch

    torch_dtype = getattr(torch, dtype)
    n = 1024
    a = torch.randn(n, n).to(torch_dtype)
    b = torch.randn(n, n).to(torch_dtype)
    src = torch.empty(64 * 2**20 // 4, dtype=torch.float32).fill_(1.0)  # 64 MiB: far past the caches
    dst = torch.empty_like(src)

    def best_rate(work: float, fn) -> float:
        fn()
        best = float("inf")
        deadline = time.perf_counter() + seconds / 2
        for _ in range(50):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
            if time.perf_counter() > deadline:
                break
        return work / best

    flops = best_rate(2 * n**3, lambda: torch.mm(a, b))
    bandwidth = best_rate(2 * src.numel() * src.element_size(), lambda: dst.copy_(src))
    return flops / 1e12, bandwidth / 1e9


def resolve_device(engine: str, shape: MoeShape, name: str | None, peak_tflops: float | None,
                   mem_bw_gbs: float | None) -> Device:
    """Config overrides first, then the GPU table (sglang) or a short measurement (embedded CPU)."""
    if peak_tflops and mem_bw_gbs:
        return Device(name or "configured device", peak_tflops, mem_bw_gbs, "config")
    if engine == "embedded":
        peak, bw = measure_cpu(shape.act_dtype)
        source = "measured on this CPU"
        if peak_tflops or mem_bw_gbs:
            source += " + config"
        return Device(name or "this CPU", peak_tflops or peak, mem_bw_gbs or bw, source)
    if not name:
        raise ValueError("moe.device.name: needed for the roofline on engine sglang (or set peak_tflops and mem_bw_gbs)")
    table = known_device(name, shape)
    if table is None:
        known = ", ".join(k for k, _ in KNOWN_DEVICES)
        raise ValueError(f"moe.device.name {name!r}: not in the roofline table ({known}); set moe.device.peak_tflops "
                         "and moe.device.mem_bw_gbs")
    return Device(name, peak_tflops or table.peak_tflops, mem_bw_gbs or table.mem_bw_gbs,
                  table.source + (" + config" if peak_tflops or mem_bw_gbs else ""))


def experts_touched(E: int, top_k: int, M: int) -> float:
    """Expected distinct experts hit by M tokens routed uniformly to top_k of E."""
    return E * (1 - (1 - top_k / E) ** M)


def roofline_row(shape: MoeShape, device: Device, M: int) -> dict:
    """Intensity, bound and verdict of one MoE layer's expert GEMMs at M tokens."""
    E, N, H, k = shape.num_experts, shape.shard_n, shape.hidden_size, shape.top_k
    touched = experts_touched(E, k, M)
    flops = 6 * M * k * H * N
    weight_bytes = touched * 3 * H * N * shape.weight_bytes
    act_bytes = shape.act_bytes * (2 * M * H + 6 * M * k * N)  # tokens in/out, gate-up and activation round trips
    intensity = flops / (weight_bytes + act_bytes)
    bound = MEMORY_BOUND if intensity < device.ridge else COMPUTE_BOUND
    return {
        "batch_size": M,
        "E": E,
        "N": N,
        "hidden_size": H,
        "top_k": k,
        "weight_dtype": shape.kernel_dtype or shape.act_dtype,
        "experts_touched": round(touched, 2),
        "gflops": flops / 1e9,
        "mbytes": (weight_bytes + act_bytes) / 1e6,
        "intensity_flop_per_byte": intensity,
        "ridge_flop_per_byte": device.ridge,
        "intensity_over_ridge": intensity / device.ridge,
        "memory_time_us": (weight_bytes + act_bytes) / (device.mem_bw_gbs * 1e3),
        "compute_time_us": flops / (device.peak_tflops * 1e6),
        "device": device.name,
        "peak_tflops": device.peak_tflops,
        "mem_bw_gbs": device.mem_bw_gbs,
        "device_source": device.source,
        "verdict": bound,
    }


def roofline_table(shape: MoeShape, device: Device, batch_sizes: list[int]) -> pd.DataFrame:
    """One row per batch size."""
    return pd.DataFrame([roofline_row(shape, device, M) for M in sorted(batch_sizes)])


def roofline_chart(table: pd.DataFrame):
    """Intensity per batch size against the ridge line (log-log)."""
    import altair as alt

    base = alt.Chart(table).encode(x=alt.X("batch_size:Q", scale=alt.Scale(type="log"), title="tokens per forward (M)"))
    points = base.mark_line(point=True).encode(
        y=alt.Y("intensity_flop_per_byte:Q", scale=alt.Scale(type="log"), title="arithmetic intensity (FLOP/byte)"),
        color=alt.Color("verdict:N", title=None),
        tooltip=["batch_size", "experts_touched", "intensity_flop_per_byte", "ridge_flop_per_byte", "verdict"],
    )
    ridge = base.mark_rule(strokeDash=[6, 4], color="gray").encode(y="ridge_flop_per_byte:Q")
    title = (f"Expert GEMMs E={table.E[0]}, N={table.N[0]}, H={table.hidden_size[0]}, top-{table.top_k[0]} "
             f"on {table.device[0]} (ridge {table.ridge_flop_per_byte[0]:.0f} FLOP/B, dashed)")
    return (points + ridge).properties(title=title, width=480, height=300)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of the roofline rule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model dir or config.json")
    parser.add_argument("--engine", choices=("embedded", "sglang"), required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", required=True)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--ep-size", type=int, default=1)
    parser.add_argument("--device-name", default=None)
    parser.add_argument("--device-from", type=Path, default=None,
                        help="merged.json of the tuning rules: take the device name the configs were tuned on")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--mem-bw-gbs", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None, help="embedded: torch threads for the CPU measurement")
    parser.add_argument("--out", required=True, help="roofline.csv")
    parser.add_argument("--plot", required=True, help="roofline.svg")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    shape = read_moe_shape(args.model, args.tp_size, args.ep_size)
    name = args.device_name
    if name is None and args.device_from is not None:
        name = json.loads(args.device_from.read_text())["device_name"]
    device = resolve_device(args.engine, shape, name, args.peak_tflops, args.mem_bw_gbs)
    table = roofline_table(shape, device, args.batch_sizes)
    atomic_write_text(args.out, table.to_csv(index=False))
    import vl_convert as vlc

    atomic_write_text(args.plot, vlc.vegalite_to_svg(roofline_chart(table).to_json()))
    print(table[["batch_size", "experts_touched", "intensity_flop_per_byte", "ridge_flop_per_byte", "verdict"]].to_string(index=False))


if __name__ == "__main__":
    main()
