"""``benchmarks/results/`` holds only what the docs cite, and the benchmark page's figures table is made from it.

The record the figures come from is named once, ``refops_figures_run`` in ``docs/conf.py``
(``docs/_ext/benchmark_figures.py``); superseded records leave the tree (git history keeps them) and
``benchmarks/results/FINDINGS.md`` keeps their conclusions.
"""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"


def figures_run() -> str:
    found = re.search(r'^refops_figures_run = "([^"]+)"$', (DOCS / "conf.py").read_text(), re.MULTILINE)
    assert found, "docs/conf.py does not set refops_figures_run"
    return found.group(1)


@pytest.fixture(scope="module")
def benchmark_figures():
    # The docs extra installs Sphinx (CI has it); a GPU machine with only the runtime may not.
    pytest.importorskip("sphinx.application", reason="the figures extension is a Sphinx extension: needs Sphinx")
    sys.path[:0] = [str(DOCS / "_ext")]
    try:
        import benchmark_figures
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return benchmark_figures


def test_every_record_in_the_tree_is_cited_by_the_docs():
    cited = (DOCS / "conf.py").read_text() + (DOCS / "benchmarks.md").read_text()
    records = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    assert figures_run() in records
    uncited = [name for name in records if name not in cited]
    assert not uncited, f"superseded run records (git rm -r them; FINDINGS.md keeps their conclusions): {uncited}"
    assert (RESULTS / "FINDINGS.md").read_text().count("\n") <= 80, "FINDINGS.md is a page at most"


def test_the_cited_record_has_what_the_page_shows(benchmark_figures):
    record = benchmark_figures.record_dir(figures_run())
    for name in ("fastpath_bench.json", "fastpath_bench.md", "fastpath_roofline.png", "README.md"):
        assert (record / name).is_file(), f"{record.name} lacks {name}"
    with pytest.raises(Exception, match="refops_figures_run = 'h200-no-such-run'"):
        benchmark_figures.record_dir("h200-no-such-run")


def test_the_figures_table_holds_each_family_against_its_floor(benchmark_figures):
    def kernel(name, family, ms, gbps, pct):
        return {"name": name, "family": family, "implementation": "fastpath", "ms": ms, "gbps": gbps,
                "pct_of_copy": pct}

    data = {
        "meta": {"device": "GPU X", "torch": "t", "cupy": "c", "date": "2030-01-02T03:04:05",
                 "kernel_shape": [4, 8], "kernel_mib": 1.0},
        "copy": {"ms": 0.1, "gbps": 4000.0},
        "kernels": [kernel("fp8 row", "quantize", 0.1, 3900.0, 97.5), kernel("nvfp4 a", "quantize", 0.3, 1200.0, 30.0),
                    kernel("relu forward", "activation", 0.12, 3300.0, 82.0),
                    {**kernel("gelu forward", "activation", 9.0, 40.0, 1.0), "implementation": "reference"}],
    }
    table = benchmark_figures.summary_markdown(data, "run-x")
    assert "`benchmarks/results/run-x/`" in table and "GPU X" in table and "2030-01-02" in table
    assert "| device-to-device copy | 0.100 | 4000 | 100 | | |" in table
    assert "| quantize (2) | 0.100-0.300 | 1200-3900 | 30-98 | >= 85 % | nvfp4 a (30 %) |" in table
    assert "| activation (1) | 0.120 | 3300 | 82 | >= 80 % | none |" in table  # the reference's row is not counted
    assert "dequantize" not in table and "pipeline" not in table  # no rows for what the run did not measure


def test_the_page_takes_the_record_tables_from_their_first_section(benchmark_figures):
    report = "# Fast-path benchmark\n\nGPU X; shape line\n\n## Kernels\n\n| a |\n\n## Pipeline\n\n![roofline](r.png)\n"
    assert benchmark_figures.record_tables(report) == "## Kernels\n\n| a |\n\n## Pipeline\n"
    with pytest.raises(Exception, match="no '## ' section"):
        benchmark_figures.record_tables("# title only\n")
