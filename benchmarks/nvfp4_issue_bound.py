"""NVFP4 pass 2 at the GPU's peak instruction issue rate, against the 85 % floor of the issue.

    python benchmarks/nvfp4_issue_bound.py benchmarks/results/h200-2026-12-01-run45

Reads a GPU run's ``ncu_pass2.txt`` (the GPU's SM count and highest SM clock, then Nsight Compute's CSV of the
pass-2 kernels, ``smsp__inst_executed.sum`` per launch) and its ``fastpath_bench.json`` (the copy bandwidth and the
bytes each pass-2 case must move). Prints two tables:

- **measured**: the time each kernel's executed warp instructions take if every scheduler issued one warp
  instruction on every cycle at the highest clock (no kernel can be faster), beside the time that 85 % of the copy
  allows for its bytes;
- **model**: the same for the fewest instructions each option set needs with the exact formulations this project
  has (``per_element``: the element's product and E2M1 code per orientation and candidate, 4over6's errors, the
  RHT's butterflies, one widening and one code placement per element), with no address, loop, amax, scale, sign,
  memory or branch instruction at all.

Where even the model is slower than the floor, no kernel built from those formulations can meet it on that GPU.
Hopper has no E2M1 conversion instruction (``cvt.rn.satfinite.e2m1x2.f32`` needs sm_100a or later:
``tests/fastpath/test_e2m1_conversion_target.py``), which is why each code costs several instructions.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
import sys
from typing import Optional, Sequence

ELEMENTS = 16384 * 8192  # the benchmark's kernel tensor
SCHEDULERS_PER_SM = 4  # Hopper: four sub-partitions per SM, each issuing at most one warp instruction a cycle
WARP = 32
FLOOR = 0.85  # of the device-to-device copy

# Kernel -> the benchmark case (benchmarks/_kernel_cases.py) that launches it.
KERNEL_CASES = {
    "nvfp4_quantize_std_bf16": "nvfp4 1x16 row+col (x), pass 2",
    "nvfp4_quantize_2d_bf16": "nvfp4 16x16 (2D) row+col (w), pass 2",
    "nvfp4_quantize_rht_bf16": "nvfp4 row + RHT col (x), pass 2",
    "nvfp4_quantize_sr_rht_bf16": "nvfp4 SR row + RHT col (dy), pass 2",
    "nvfp4_quantize_4o6_bf16": "nvfp4 4over6 row+col, pass 2",
    "nvfp4_quantize_sr_bf16": "nvfp4 SR row+col, pass 2",
    "nvfp4_quantize_2d_sr_bf16": "nvfp4 16x16 (2D) SR row+col, pass 2",
    "nvfp4_quantize_4o6_2d_bf16": "nvfp4 4over6 16x16 (2D) row+col, pass 2",
}

# Lane instructions per element and orientation (or per candidate), as this project computes them exactly:
ENCODE_RNE = 5  # v = RN(x * enc): FMUL; e2m1_rne_min3: two FFMAs and an FADD, one VIMNMX3
ENCODE_RNE_FOLDED = 4  # the product folded into the three roundings: exact only for some scale bytes (GPU run 38)
ENCODE_SR = 12  # FMUL; e2m1_sr_min3: byte gather and FADD (u), FMNMX x2 and LOP3 (step), FFMA (t), 3 roundings, 2 minima
ERROR_4OVER6 = 3  # per candidate: the decoded value's table load, RN(val - |x|), RN(err + |diff|)
RHT16 = 5  # column-wise 16-point transform: 4 butterfly stages of one add each, and the output's bf16 rounding
SHARED = 2  # per element, both orientations together: one widening to fp32 and one code placement


def per_element(option_set: str, encode_rne: int = ENCODE_RNE) -> int:
    """The model's lane instructions per element for one pass-2 option set (the kernel name's middle part)."""
    two_orientations = {
        "std": 2 * encode_rne,
        "2d": 2 * encode_rne,
        "rht": 2 * encode_rne + RHT16,
        "sr": 2 * ENCODE_SR,
        "2d_sr": 2 * ENCODE_SR,
        "sr_rht": 2 * ENCODE_SR + RHT16,
        "4o6": 2 * (2 * encode_rne + 2 * ERROR_4OVER6),
        "4o6_2d": 2 * (2 * encode_rne + 2 * ERROR_4OVER6),
    }
    if option_set not in two_orientations:
        raise ValueError(f"per_element: unknown NVFP4 pass-2 option set {option_set!r}; "
                         f"expected one of {sorted(two_orientations)}")
    return SHARED + two_orientations[option_set]


@dataclasses.dataclass(frozen=True)
class Gpu:
    """What bounds the issue rate: SM count and the highest SM clock (MHz)."""

    name: str
    sm_count: int
    max_sm_mhz: float

    @property
    def warp_instructions_per_second(self) -> float:
        return self.sm_count * SCHEDULERS_PER_SM * self.max_sm_mhz * 1e6


@dataclasses.dataclass(frozen=True)
class Row:
    """One pass-2 kernel: executed warp instructions (None when the run did not count it) and the floor for its
    bytes; the model's instructions per element follow from the kernel's option set."""

    kernel: str
    bytes: int
    floor_ms: float
    warp_instructions: Optional[int]

    @property
    def model_per_element(self) -> int:
        return per_element(option_set(self.kernel))

    @property
    def model_folded_per_element(self) -> int:
        return per_element(option_set(self.kernel), ENCODE_RNE_FOLDED)


@dataclasses.dataclass(frozen=True)
class Report:
    gpu: Gpu
    copy_gbps: float
    rows: list[Row]

    def peak_issue_ms(self, warp_instructions: float) -> float:
        return warp_instructions / self.gpu.warp_instructions_per_second * 1e3

    def model_ms(self, per_element_lane_instructions: int) -> float:
        return self.peak_issue_ms(per_element_lane_instructions * ELEMENTS / WARP)


def option_set(kernel: str) -> str:
    """``nvfp4_quantize_4o6_2d_bf16`` -> ``4o6_2d``."""
    prefix, suffix = "nvfp4_quantize_", "_bf16"
    if not (kernel.startswith(prefix) and kernel.endswith(suffix)):
        raise ValueError(f"option_set: {kernel!r} is not an NVFP4 pass-2 kernel name ({prefix}<set>{suffix})")
    return kernel[len(prefix):-len(suffix)]


def parse_ncu(path: pathlib.Path) -> tuple[Gpu, dict[str, int]]:
    """The GPU lines and the first launch's ``smsp__inst_executed.sum`` of each kernel in an ncu_pass2.txt."""
    lines = path.read_text().splitlines()
    gpu_name, max_mhz, sm_count = None, None, None
    for i, line in enumerate(lines):
        if line.startswith("name,") and "clocks.max.sm" in line and i + 1 < len(lines):
            fields = [f.strip() for f in lines[i + 1].split(",")]
            gpu_name, max_mhz = fields[0], float(fields[2].split()[0])
        elif line.startswith("sm_count "):
            sm_count = int(line.split()[1])
    if gpu_name is None or sm_count is None:
        raise ValueError(f"parse_ncu: {path} lacks the GPU lines (nvidia-smi clocks.max.sm, then 'sm_count N')")
    counts: dict[str, int] = {}
    for record in csv.reader(line for line in lines if line.startswith('"')):
        if len(record) == 15 and record[12] == "smsp__inst_executed.sum":
            counts.setdefault(record[4], int(record[14].replace(",", "")))
    if not counts:
        raise ValueError(f"parse_ncu: {path} holds no smsp__inst_executed.sum rows")
    return Gpu(gpu_name, sm_count, max_mhz), counts


def read_run(run_dir: pathlib.Path) -> Report:
    """The report for one GPU run's folder (ncu_pass2.txt and fastpath_bench.json)."""
    run_dir = pathlib.Path(run_dir)
    gpu, counts = parse_ncu(run_dir / "ncu_pass2.txt")
    bench = json.loads((run_dir / "fastpath_bench.json").read_text())
    copy_gbps = float(bench["copy"]["gbps"])
    case_bytes = {k["name"]: int(k["bytes"]) for k in bench["kernels"]}
    rows = []
    for kernel, case in KERNEL_CASES.items():
        if case not in case_bytes:
            raise ValueError(f"read_run: {run_dir}/fastpath_bench.json has no case {case!r}")
        nbytes = case_bytes[case]
        rows.append(Row(kernel, nbytes, nbytes / (FLOOR * copy_gbps * 1e9) * 1e3, counts.get(kernel)))
    return Report(gpu, copy_gbps, rows)


def format_report(report: Report) -> str:
    g = report.gpu
    out = [f"{g.name}: {g.sm_count} SMs x {SCHEDULERS_PER_SM} schedulers x {g.max_sm_mhz:.0f} MHz = "
           f"{g.warp_instructions_per_second / 1e12:.4f} T warp instructions/s at most; copy {report.copy_gbps:.0f} GB/s, "
           f"floor {FLOOR:.0%} of it", "",
           "| kernel | MiB | floor ms | executed (M warp inst.) | per element | at peak issue, ms | model per element "
           "| model at peak, ms | floor within reach of the model? |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        measured = ("-", "-", "-") if r.warp_instructions is None else (
            f"{r.warp_instructions / 1e6:.1f}", f"{r.warp_instructions * WARP / ELEMENTS:.2f}",
            f"{report.peak_issue_ms(r.warp_instructions):.4f}")
        model, folded = report.model_ms(r.model_per_element), report.model_ms(r.model_folded_per_element)
        reach = "yes" if model <= r.floor_ms else ("no" if folded > r.floor_ms else "only folded")
        out.append(f"| {option_set(r.kernel)} | {r.bytes / 2**20:.0f} | {r.floor_ms:.4f} | {' | '.join(measured)} "
                   f"| {r.model_per_element} ({r.model_folded_per_element} folded) | {model:.4f} ({folded:.4f}) "
                   f"| {reach} |")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python benchmarks/nvfp4_issue_bound.py RUN_DIR (holding ncu_pass2.txt and fastpath_bench.json)")
        return 2
    print(format_report(read_run(pathlib.Path(args[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
