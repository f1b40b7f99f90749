"""The quick test command's output (README, Quick start): failures in the short summary, skips only on request.

pyproject.toml's ``addopts`` used to be ``-ra``, which ended every CPU run with one line per skipped GPU
test (59 of them). The reasons stay one option away: ``-ra``.
"""

from __future__ import annotations

import pathlib
import re
import shlex

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytest_plugins = ["pytester"]


def _addopts() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.pytest.ini_options]", 1)[1]
    match = re.search(r'^addopts\s*=\s*"([^"]*)"', section, flags=re.MULTILINE)
    assert match, "pyproject.toml: [tool.pytest.ini_options] has no addopts"
    return shlex.split(match.group(1))


def test_default_summary_lists_failures_but_not_skips(pytester):
    pytester.makepyfile(
        test_sample="""
import pytest

def test_ok():
    pass

@pytest.mark.skip(reason="needs a CUDA GPU")
def test_gpu():
    pass

def test_broken():
    assert 1 == 2
"""
    )
    default = pytester.runpytest_inprocess(*_addopts(), "-p", "no:cacheprovider")
    default.assert_outcomes(passed=1, skipped=1, failed=1)
    assert any(line.startswith("FAILED test_sample.py::test_broken") for line in default.outlines)
    assert not any(line.startswith("SKIPPED") for line in default.outlines)

    asked = pytester.runpytest_inprocess(*_addopts(), "-ra", "-p", "no:cacheprovider")
    assert any(line.startswith("SKIPPED") and "needs a CUDA GPU" in line for line in asked.outlines)
    assert any(line.startswith("FAILED test_sample.py::test_broken") for line in asked.outlines)


def test_readme_says_how_to_see_the_skip_reasons():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "add `-ra` to list every skip with its reason" in readme
