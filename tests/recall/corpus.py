"""Every case of the corpus, run once, and the table the docs page shows."""

from __future__ import annotations

import dataclasses
import functools
import pathlib

from . import (lifecycle_ao_conversion, lifecycle_lazy, lifecycle_te_module_api, lifecycle_torch_load,
               lifecycle_values, module_ao_mxfp8_linear, module_fp8_linear, module_norm, module_refops_caches,
               module_te_linear, module_torch_gelu, module_training, quantizer_ao_float8, quantizer_ao_mx,
               quantizer_block_fp8, quantizer_layout, quantizer_mxfp8, quantizer_nvfp4, quantizer_per_tensor,
               quantizer_te_scaling, quantizer_torch_cast)
from .cases import RecallCase
from .known_gaps import FAILED_TWINS, MISSED_BUGS

TABLE_BEGIN, TABLE_END = "<!-- recall-table:begin -->\n", "<!-- recall-table:end -->"

ALL_CASES: tuple[RecallCase, ...] = (
    *quantizer_per_tensor.CASES,
    *quantizer_layout.CASES,
    *quantizer_mxfp8.CASES,
    *quantizer_block_fp8.CASES,
    *quantizer_nvfp4.CASES,
    *quantizer_te_scaling.CASES,
    *quantizer_ao_float8.CASES,
    *quantizer_ao_mx.CASES,
    *quantizer_torch_cast.CASES,
    *module_fp8_linear.CASES,
    *module_norm.CASES,
    *module_training.CASES,
    *module_refops_caches.CASES,
    *module_te_linear.CASES,
    *module_ao_mxfp8_linear.CASES,
    *module_torch_gelu.CASES,
    *lifecycle_lazy.CASES,
    *lifecycle_values.CASES,
    *lifecycle_te_module_api.CASES,
    *lifecycle_ao_conversion.CASES,
    *lifecycle_torch_load.CASES,
)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """What the oracle said about one case: ``caught`` (the bug's report is not ok), ``twin_passes``."""

    case: RecallCase
    caught: bool
    twin_passes: bool


@functools.lru_cache(maxsize=1)
def run_corpus() -> tuple[CaseResult, ...]:
    """Run the oracle on every bug and every twin (once per process: the oracle is deterministic)."""
    return tuple(CaseResult(case, not case.run_bug().ok, bool(case.run_twin().ok)) for case in ALL_CASES)


#: The trackers the issue asks the corpus to draw on: TransformerEngine's, torchao's and PyTorch's own.
HOME_TRACKERS = ("NVIDIA/TransformerEngine", "pytorch/ao", "pytorch/pytorch")


def from_home_trackers(case: RecallCase) -> bool:
    return any(case.source_url.startswith(f"https://github.com/{repo}/") for repo in HOME_TRACKERS)


def recall_figures(results: tuple[CaseResult, ...]) -> str:
    """One markdown line: bugs caught and twins passing, out of the corpus, and out of its bugs from the home
    trackers."""
    caught = sum(r.caught for r in results)
    passing = sum(r.twin_passes for r in results)
    home = [r for r in results if from_home_trackers(r.case)]
    return (f"**Recall: {caught} of {len(results)} bugs caught; "
            f"{passing} of {len(results)} correct twins pass.** Of these, {len(home)} bugs come from "
            f"TransformerEngine's, torchao's and PyTorch's own trackers: {sum(r.caught for r in home)} caught, "
            f"{sum(r.twin_passes for r in home)} twins passing; the other {len(results) - len(home)} from "
            f"neighbouring projects (FBGEMM, vLLM, apex, Megatron-LM, ...).")


def _reason(result: CaseResult) -> str:
    reasons = []
    if not result.caught:
        reasons.append(MISSED_BUGS.get(result.case.name, "(not recorded in known_gaps.MISSED_BUGS)"))
    if not result.twin_passes:
        reasons.append("false alarm: " + FAILED_TWINS.get(result.case.name,
                                                          "(not recorded in known_gaps.FAILED_TWINS)"))
    return "; ".join(reasons)


def _source_label(url: str) -> str:
    # github.com/<owner>/<repo>/<pull|issues|commit>/<id> -> owner/repo#id (or @sha for a commit)
    owner, repo, kind, ident = url.removeprefix("https://github.com/").split("/")[:4]
    return f"{owner}/{repo}@{ident[:7]}" if kind == "commit" else f"{owner}/{repo}#{ident}"


def recall_table(results: tuple[CaseResult, ...]) -> str:
    """The markdown table of ``docs/oracle-recall.md``: one row per case, in corpus order."""
    rows = ["| Bug | Source | Tier | Caught | Twin passes | Why not |", "|---|---|---|---|---|---|"]
    for r in results:
        c = r.case
        summary = c.summary.replace("|", "\\|")  # a pipe would end the table cell
        rows.append(f"| `{c.name}`: {summary} | [{_source_label(c.source_url)}]({c.source_url}) | {c.tier} "
                    f"| {'yes' if r.caught else 'no'} | {'yes' if r.twin_passes else 'no'} | {_reason(r)} |")
    return "\n".join(rows)


def render_page_section() -> str:
    """The generated part of ``docs/oracle-recall.md``: the figures, then the table."""
    results = run_corpus()
    return f"{recall_figures(results)}\n\n{recall_table(results)}\n"


def write_docs_page(page: pathlib.Path) -> None:
    """Replace the generated section of ``page`` (between its begin and end markers) with the corpus's now."""
    text = page.read_text()
    head, rest = text.split(TABLE_BEGIN)
    page.write_text(head + TABLE_BEGIN + render_page_section() + TABLE_END + rest.split(TABLE_END, 1)[1])
