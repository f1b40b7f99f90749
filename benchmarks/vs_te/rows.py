"""What ``bench_vs_te.py`` measures: the rows, the training-step sizes, and the run's plan.

A *row* (:class:`Row`) is a kind of work and a recipe: a quantize call, or a training step under a recipe. The
training steps are measured at several *sizes* (:data:`STEP_SIZES`) and in two *modes*: ``eager`` (the calls as a
training loop makes them) and ``graphed`` (both sides captured as CUDA graphs, the replays timed). An
:class:`Item` of the plan is one row at one size in one mode; it becomes one record of ``vs_te.json``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

MODES = ("eager", "graphed")


@dataclasses.dataclass(frozen=True)
class Sizes:
    size: int = 8192  # the quantize rows' tensor is size x size
    tokens: int = 8192
    hidden: int = 4096
    ffn: int = 16384


#: The training-step sizes of issue #39 item 6, by the name ``--sizes`` takes, in the default order of the run
#: (the size of the earlier records first, so that a run cut short still compares with them). "large" is the
#: larger model shape: hidden 8192 / ffn 32768 (4x the parameters, 4x the FLOP of a step) at 8192 tokens. It
#: needs about 33 GiB with both sides' CUDA graphs alive (``vs_te.memory.step_memory_bytes``, an upper estimate),
#: less than half of an 80 GB H100; at 32768 tokens it would need about 88 GiB and does not fit.
STEP_SIZES: dict[str, Sizes] = {
    "8192": Sizes(tokens=8192),
    "2048": Sizes(tokens=2048),
    "32768": Sizes(tokens=32768),
    "large": Sizes(tokens=8192, hidden=8192, ffn=32768),
}


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    kind: str  # "quantize" or "step"
    recipe: Optional[str]  # quantize: fp8_current, fp8_delayed, fp8_block_1x128, fp8_block_128x128, mxfp8, nvfp4;
    #                        step: None (bf16), fp8_current, fp8_delayed, fp8_block
    baseline: str  # "te" or "compile"

    def work(self, sizes: Sizes, mode: str = "eager") -> str:
        """The row's name in the records (the issue's wording; graphed steps end in ", CUDA graphs")."""
        if self.kind == "quantize":
            what = _QUANTIZE_NAMES[self.recipe]
            peer = ", vs torch.compile peer (no TE kernel on sm_90)" if self.baseline == "compile" else ""
            return f"quantize {sizes.size}x{sizes.size} bf16, {what}, row+col{peer}"
        step = (f"training step Linear({sizes.hidden},{sizes.ffn})-GELU-Linear({sizes.ffn},{sizes.hidden}), "
                f"batch {sizes.tokens}")
        graphs = ", CUDA graphs" if mode == "graphed" else ""
        return f"{step}, {_STEP_NAMES[self.recipe]}{graphs}"


_QUANTIZE_NAMES = {
    "fp8_current": "FP8 current scaling",
    "fp8_delayed": "FP8 delayed scaling",
    "fp8_block_1x128": "FP8 block 1x128",
    "fp8_block_128x128": "FP8 block 128x128",
    "mxfp8": "MXFP8",
    "nvfp4": "NVFP4",
}
STEP_NAMES = {None: "bf16", "fp8_current": "FP8 current scaling", "fp8_delayed": "FP8 delayed scaling",
              "fp8_block": "FP8 block scaling"}
_STEP_NAMES = STEP_NAMES

ROWS: tuple[Row, ...] = (
    Row("quantize_fp8_current", "quantize", "fp8_current", "te"),
    Row("quantize_fp8_delayed", "quantize", "fp8_delayed", "te"),
    Row("quantize_fp8_block_1x128", "quantize", "fp8_block_1x128", "te"),
    Row("quantize_fp8_block_128x128", "quantize", "fp8_block_128x128", "te"),
    Row("quantize_mxfp8", "quantize", "mxfp8", "compile"),
    Row("quantize_nvfp4", "quantize", "nvfp4", "compile"),
    Row("step_bf16", "step", None, "te"),
    Row("step_fp8_current", "step", "fp8_current", "te"),
    Row("step_fp8_delayed", "step", "fp8_delayed", "te"),
    Row("step_fp8_block", "step", "fp8_block", "te"),
)


def select_rows(spec: Optional[str], rows: Sequence[Row] = ROWS) -> list[Row]:
    """The rows ``--rows`` names: comma-separated keys or substrings of keys (all rows for None or "")."""
    if not spec:
        return list(rows)
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    chosen = [r for r in rows if any(w == r.key or w in r.key for w in wanted)]
    unknown = [w for w in wanted if not any(w == r.key or w in r.key for r in rows)]
    if unknown:
        raise ValueError(f"bench_vs_te.py --rows: no row matches {unknown}; the rows are {[r.key for r in rows]}")
    return chosen


def select_sizes(spec: Optional[str]) -> list[tuple[str, Sizes]]:
    """The step sizes ``--sizes`` names, in the order given ("all", None or "": every size, default order)."""
    if not spec or spec.strip() == "all":
        return list(STEP_SIZES.items())
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in STEP_SIZES]
    if unknown:
        raise ValueError(f"bench_vs_te.py --sizes: unknown size {unknown}; the sizes are {list(STEP_SIZES)} or all")
    return [(n, STEP_SIZES[n]) for n in dict.fromkeys(names)]


def select_modes(spec: Optional[str]) -> list[str]:
    """The step modes ``--modes`` names (``eager``, ``graphed``; both for None or "")."""
    if not spec:
        return list(MODES)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(f"bench_vs_te.py --modes: unknown mode {unknown}; the modes are {list(MODES)}")
    return [m for m in MODES if m in names]


def step_flops(sizes: Sizes) -> float:
    """FLOP of one training step: forward, dgrad and wgrad GEMMs of both linears (the element-wise work aside)."""
    return 6 * 2.0 * sizes.tokens * sizes.hidden * sizes.ffn


@dataclasses.dataclass(frozen=True)
class Item:
    """One record of the run: ``row`` at ``sizes`` (``size_name`` of :data:`STEP_SIZES`, or "custom") in ``mode``."""

    row: Row
    sizes: Sizes
    size_name: Optional[str] = None  # None for the quantize rows (their size is ``sizes.size``)
    mode: str = "eager"

    @property
    def id(self) -> str:
        """Unique within a run: the row's key, then ``@size`` and ``+graphed`` for the steps."""
        if self.row.kind == "quantize":
            return self.row.key
        return f"{self.row.key}@{self.size_name}" + ("+graphed" if self.mode == "graphed" else "")

    @property
    def work(self) -> str:
        return self.row.work(self.sizes, self.mode)


def make_plan(rows: Sequence[Row], sizes: Sequence[tuple[str, Sizes]], modes: Sequence[str],
              quantize_size: int = Sizes.size) -> list[Item]:
    """The run's items in order: the quantize rows, then for each step size in turn, each step row's modes
    (eager, then graphed) one after the other, so that a run cut short holds complete pairs."""
    plan = [Item(r, Sizes(size=quantize_size)) for r in rows if r.kind == "quantize"]
    for name, size in sizes:
        size = dataclasses.replace(size, size=quantize_size)
        for row in rows:
            if row.kind == "step":
                plan += [Item(row, size, name, mode) for mode in modes]
    return plan
