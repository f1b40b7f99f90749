"""The lifecycle page's holders figure: who points at a weight's ``Parameter`` object, before and after it is materialized.

Four references lead to one weight of a meta-built ``te.ops.Linear``: the optimizer's parameter list, the fuser's
parameter cache, ``Linear.weight`` (an alias) and the basic op's own ``weight`` (the owner, what
``named_parameters()`` reports). Materialization either fills the object they point at or replaces it.

refops' row is measured, not drawn from a description: :func:`measure_refops` builds the model on ``meta``, creates
an optimizer, and records the ``id()`` of the object each holder points at, before and after the first forward.
The figure then draws what it found, so the picture changes if refops does. TransformerEngine is not installed
here, so TE's two rows are stated, from the description of TE PR #3327: before the fix, materialization gave the
basic op a new ``Parameter`` and nothing else was updated; the fix re-caches the fuser's list and re-syncs
``Linear``'s alias, and an optimizer built before the first forward still holds the meta object.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import refops as te  # noqa: E402
from format_figures import png_bytes  # noqa: E402
from refops.ops.fuser import OperationFuser  # noqa: E402

__all__ = ["FILE_NAME", "FIGURES", "HOLDERS", "Panel", "Row", "measure_refops", "rows", "figure_bytes"]

FILE_NAME = "lifecycle-holders.png"

#: The holders, top to bottom: (label on the figure, what it is in code).
HOLDERS: tuple[tuple[str, str], ...] = (
    ("optimizer", "optimizer.param_groups[0]['params'][0]"),
    ("fuser's cache", "fuser._flat_basic_op_params[0]"),
    ("Linear.weight (alias)", "linear.weight"),
    ("BasicLinear.weight (owner)", "linear.basic_ops[0].weight"),
)
OWNER = len(HOLDERS) - 1


@dataclasses.dataclass(frozen=True)
class Panel:
    """One moment: for each holder, the number of the object it points at (None: it holds nothing yet), and where
    each object's data is (``{number: "meta"}``)."""

    points_at: tuple[Optional[int], ...]
    devices: dict[int, str]


@dataclasses.dataclass(frozen=True)
class Row:
    """One implementation: its name, the panel before materialization and the one after."""

    title: str
    before: Panel
    after: Panel


def measure_refops() -> Row:
    """refops' row, measured: the ``id()`` each holder points at, before and after the first forward, numbered."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device("cpu"):  # materialize on the CPU on any machine
            model = te.ops.Sequential(te.ops.Linear(16, 8, device="meta"))
        linear = model[0]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        # Sequential builds its fuser at the first forward; a fuser's cache is empty until materialization
        # (measured on a fuser of a second, identical op, so that the model's own first forward is untouched).
        fresh_cache = OperationFuser([te.ops.Linear(16, 8, device="meta")])._flat_basic_op_params

        def holders() -> list[tuple[Optional[torch.Tensor], str]]:
            groups = model._module_groups  # None until the first forward
            cache = groups[0]._flat_basic_op_params if groups else fresh_cache
            objects = [optimizer.param_groups[0]["params"][0], cache[0] if cache else None,
                       linear.weight, linear.basic_ops[0].weight]
            return [(o, "" if o is None else o.device.type) for o in objects]  # devices now: a swap changes them

        before = holders()
        model(torch.randn(4, 16)).square().mean().backward()
        after = holders()  # `before` keeps its objects alive, so no id() is reused
    numbers: dict[int, int] = {}
    for obj, _ in [*before, *after]:
        if obj is not None:
            numbers.setdefault(id(obj), len(numbers) + 1)

    def panel(held: list[tuple[Optional[torch.Tensor], str]]) -> Panel:
        return Panel(tuple(None if o is None else numbers[id(o)] for o, _ in held),
                     {numbers[id(o)]: device for o, device in held if o is not None})

    return Row("refops", panel(before), panel(after))


def rows() -> list[Row]:
    """TE before PR #3327, TE with it (both stated), and refops (measured)."""
    meta = Panel((1, 1, 1, 1), {1: "meta"})
    return [
        Row("TE before PR #3327", meta, Panel((1, 1, 1, 2), {1: "meta", 2: "cuda"})),
        Row("TE with PR #3327", meta, Panel((1, 2, 2, 2), {1: "meta", 2: "cuda"})),
        measure_refops(),
    ]


_OK, _STALE, _EMPTY = "#2b7a3d", "#c62828", "#9e9e9e"


def _draw_panel(ax: plt.Axes, panel: Panel, title: str, previous: Optional[Panel]) -> None:
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.5, len(HOLDERS) - 0.5)
    ax.invert_yaxis()
    ax.axis("off")
    ax.set_title(title, fontsize=10, loc="left")
    objects = sorted(panel.devices)
    # Objects stacked on the right, centred on the holders that point at them.
    slots = {n: (len(HOLDERS) - 1) * (i + 0.5) / len(objects) for i, n in enumerate(objects)}
    owner = panel.points_at[OWNER]
    for number, y in slots.items():
        device = panel.devices[number]
        kept = previous is not None and number in previous.devices
        if previous is None:
            note = ""
        elif kept and previous.devices[number] != device:
            note = ", filled in place"
        elif not kept:
            note = ", new"
        else:
            note = ", stale" if device == "meta" else ""
        colour = _STALE if number != owner else _OK
        ax.text(0.66, y, f"Parameter {number}\n{device}{note}", ha="left", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.4", facecolor="white", edgecolor=colour, linewidth=1.5))
    for row, ((label, _), number) in enumerate(zip(HOLDERS, panel.points_at)):
        ax.text(0.0, row, label, ha="left", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.3", facecolor="#f2f2f2", edgecolor="#888888"))
        if number is None:
            ax.text(0.24, row, "(empty)", ha="left", va="center", fontsize=9, color=_EMPTY, style="italic")
            continue
        colour = _OK if number == owner else _STALE
        ax.annotate("", xy=(0.64, slots[number]), xytext=(0.45, row),
                    arrowprops=dict(arrowstyle="-|>", color=colour, linewidth=1.4, shrinkA=2, shrinkB=4))


def figure_bytes() -> bytes:
    """The figure: one row per implementation, before and after materialization, as PNG bytes."""
    table = rows()
    fig, axes = plt.subplots(len(table), 2, figsize=(9, 2.3 * len(table)))
    for (left, right), row in zip(axes, table):
        _draw_panel(left, row.before, f"{row.title}: before materialization", None)
        _draw_panel(right, row.after, f"{row.title}: after materialization", row.before)
    fig.text(0.5, 0.0, "green: the object the op computes with; red: another object (a stale one)",
             ha="center", fontsize=9)
    fig.tight_layout(h_pad=1.5, w_pad=2.0)
    return png_bytes(fig)


#: File name -> function returning its bytes, for ``refops_artifacts.ARTIFACTS``.
FIGURES = {FILE_NAME: figure_bytes}
