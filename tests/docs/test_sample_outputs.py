"""Sample outputs on the pages come from the commands, and the quick start says what it installs (issue #37).

The pages include ``_generated/sample-*.txt`` (``docs/_ext/sample_outputs.py`` runs the commands at build time);
``test_sphinx_build.py`` checks that the built pages show them. Here: no page keeps a hand-copied sample of a
refops command, every sample a page includes is one the build generates, the samples say what the commands
print now, and the README's quick start is the one CI runs.
"""

from __future__ import annotations

import pathlib
import re
import sys


import pytest

tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads pyproject.toml with tomllib")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if not any(part.startswith("_") for part in p.relative_to(DOCS).parts))
# A directive fence (```{figure} ...) is matched as a unit too, so that its closing ``` is not taken for the
# opening of a plain block.
_FENCE = re.compile(r"^```(\{[^}\n]*\}[^\n]*|\w*)\n(.*?)^```", re.S | re.M)
_INCLUDE = re.compile(r"^```\{literalinclude\} (\S+)", re.M)


@pytest.fixture(scope="module")
def samples():
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import sample_outputs
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return sample_outputs


def test_no_page_keeps_a_hand_copied_sample_of_a_refops_command():
    copied = []
    for page in PAGES:
        for language, body in _FENCE.findall(page.read_text()):
            first = body.lstrip().splitlines()[0] if body.strip() else ""
            if language in ("text", "console", "") and (
                    first.startswith("$ python") or first.startswith("== ") or first.startswith("refops ")):
                copied.append(f"{page.relative_to(DOCS)}: {first}")
    assert not copied, "sample outputs copied by hand (include a generated one instead):\n" + "\n".join(copied)


def test_every_included_sample_is_generated_by_the_build(samples):
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import refops_artifacts
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    included = {}
    for page in PAGES:
        for target in _INCLUDE.findall(page.read_text()):
            path = (page.parent / target).resolve()
            if "_generated" in path.parts:
                included[path.name] = page.relative_to(DOCS)
    assert set(samples.SAMPLES) <= set(refops_artifacts.ARTIFACTS)
    assert {"sample-check.txt", "sample-trace-step.txt", "sample-conformance-unavailable.txt"} <= included.keys()
    unknown = {name: page for name, page in included.items() if name not in refops_artifacts.ARTIFACTS}
    assert not unknown, f"pages include files the build does not generate: {unknown}"


def test_the_samples_are_what_the_commands_print(samples):
    status, out, _ = samples.run_cli(samples.TRACE_ARGS)
    assert status == 0
    step = samples.trace_step().decode().splitlines()
    printed = out.splitlines()
    assert step[0].startswith("== training step 1 (")
    assert all(line == "  ..." or line in printed for line in step), "an excerpt line the command did not print"
    weights = [line for line in step if "materialize        BasicLinear.weight" in line]
    assert [line.split("(op=")[1].split(",")[0] for line in weights] == ["1.basic_ops.0", "3.basic_ops.0"]
    assert "recipe=none" in step[1]

    check = samples.check().decode()
    assert check.startswith("$ python -m refops check ") and "14/14 cases passed, 0 skipped" in check
    rows = [line for line in check.splitlines() if line.startswith(("linear ", "mlp "))]
    assert len(rows) == 14 and all(" ok " in row for row in rows)
    assert not [row for row in rows if "max_rel" in row or "inf" in row], "ok rows with alarming numbers"

    conformance = samples.conformance_unavailable().decode().splitlines()
    assert len(conformance) == 4 and conformance[-1] == "(exit status 2)"  # the command, two reasons, the status
    assert "no CUDA GPU is visible" in conformance[1]
    assert conformance[2].endswith("pip install --no-build-isolation 'transformer_engine[pytorch]'")


# ------------------------------------------------------------------------------------------------ the quick start
QUICK_START = [
    "python3 -m pip install torch==2.13.0 -e . && python3 -m refops trace",
    'python3 -m pip install torch==2.13.0 -e ".[test]" && python3 -m pytest -q',
]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_readme_ci_and_getting_started_give_the_same_two_commands():
    for page in (ROOT / "README.md", DOCS / "getting-started.md"):
        blocks = [body.splitlines() for language, body in _FENCE.findall(page.read_text()) if language == "bash"]
        assert QUICK_START in blocks, f"{page.name} lost the quick start's two commands"
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == QUICK_START[1], "CI no longer runs the README's test command"


def test_the_quick_start_says_what_the_pin_pulls_and_how_to_get_the_cpu_build():
    for page in (ROOT / "README.md", DOCS / "getting-started.md"):
        text = " ".join(page.read_text().replace("\\\n", " ").split())  # a shell line continued with \ is one
        assert "PyPI serves the CUDA build" in text, page.name
        assert f"python3 -m pip install torch==2.13.0 --index-url {CPU_INDEX}" in text, page.name
        assert f"--extra-index-url {CPU_INDEX}" in text, page.name
        assert "takes the CPU build" not in text and "selects the CPU build" not in text, page.name


def test_the_docs_extra_has_what_the_build_imports():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~ \[]", requirement)[0] for requirement in extras["docs"]}
    # autodoc imports refops.testing.pytest_plugin (docs/api/testing.md), which imports pytest.
    assert "pytest" in names
    assert "refops.testing.pytest_plugin" in (DOCS / "api" / "testing.md").read_text()
    assert names <= {re.split(r"[<>=!~ \[]", r)[0] for r in extras["test"]}, "the test extra builds the docs too"
