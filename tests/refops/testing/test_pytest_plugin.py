"""The pytest plugin as a project uses it: one line in conftest.py, the --device option, the fixtures."""

from __future__ import annotations

# pytester's in-process runs put sys.modules back as they found it. A torch module first imported inside
# one (an optimizer's first step imports torch._dynamo lazily) is then imported a second time by a later
# test and registers its operator library twice ("Only a single TORCH_LIBRARY can be used to register the
# namespace _inductor_test"). Imported here, at collection, it is part of every snapshot.
import torch._dynamo  # noqa: F401

pytest_plugins = ["pytester"]


def test_a_project_adds_the_oracle_in_a_few_lines(pytester):
    pytester.makeconftest('pytest_plugins = ["refops.testing.pytest_plugin"]\n')
    pytester.makepyfile(
        test_mine="""
import torch
import refops as te


def test_my_linear_matches_the_reference(oracle, device):
    mine = torch.nn.Linear(16, 8, device=device)
    report = oracle.compare(mine, te.ops.Linear(16, 8, device=device), (torch.randn(4, 16, device=device),))
    report.assert_ok()
    assert torch.get_default_device() == device


def test_my_module_honours_the_lifecycle(oracle):
    report = oracle.check_lifecycle(lambda d: te.ops.Linear(8, 4, device=d), inputs=lambda d: (torch.randn(2, 8, device=d),))
    report.assert_ok()


def test_a_broken_candidate_fails(oracle, device):
    mine = torch.nn.Linear(16, 8, device=device)
    report = oracle.compare(mine, te.ops.Linear(16, 8, device=device), (torch.randn(4, 16, device=device),))
    with torch.no_grad():
        mine.bias += 1
    report = oracle.compare(mine, te.ops.Linear(16, 8, device=device), (torch.randn(4, 16, device=device),),
                            copy_parameters=False)
    assert not report.ok
"""
    )
    result = pytester.runpytest("--device", "cpu", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_a_kernel_author_checks_a_quantizer_first(pytester):
    pytester.makeconftest('pytest_plugins = ["refops.testing.pytest_plugin"]\n')
    pytester.makepyfile(
        test_kernel="""
import pytest
import torch
import refops as te


def my_fp8_quantize(x, quantizer):
    amax = x.float().abs().nan_to_num(nan=0.0, posinf=float("inf")).amax().reshape(1)
    scale_inv = amax / 448.0  # the bug: x / (amax / 448) instead of x * (448 / amax)
    data = (x.float() / scale_inv).clamp(-448, 448).to(torch.float8_e4m3fn)
    return data if quantizer.rowwise_usage else data.t().contiguous(), scale_inv


def test_with_the_fixture(quantizer_checker, device):
    report = quantizer_checker(my_fp8_quantize, te.recipe.Float8CurrentScaling(), cases=["normal", "ties"])
    assert report["ties", "float32", "rowwise"].status == "differs"
    report.assert_ok()


def test_with_the_oracle(oracle):
    report = oracle.check_quantizer(lambda x, q: q(x), te.recipe.MXFP8BlockScaling(), cases=["normal", "ties"])
    report.assert_ok()
"""
    )
    result = pytester.runpytest("--device", "cpu", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*check_quantizer: my_fp8_quantize against Float8CurrentScalingQuantizer*FAILED*",
                                 "*ties/float32/rowwise at *expected 0x*got 0x*"])


def test_requesting_cuda_without_a_gpu_is_a_usage_error(pytester):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("a GPU is present, so --device cuda is valid")
    pytester.makeconftest('pytest_plugins = ["refops.testing.pytest_plugin"]\n')
    pytester.makepyfile(test_x="def test_x():\n    assert True\n")
    result = pytester.runpytest("--device", "cuda")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--device cuda was requested but torch reports no CUDA device*"])


NESTED_TEST = "def test_x(device):\n    assert device.type == 'cpu'\n"


def test_a_nested_conftest_cannot_enable_the_plugin_and_the_documented_ways_can(pytester):
    """pytest's rule, which docs/oracle.md and the plugin's docstring state: pytest_plugins only in the
    top-level conftest.py; -p (or addopts) works wherever the tests are."""
    pytester.makepyfile(**{"tests/unit/conftest.py": 'pytest_plugins = ["refops.testing.pytest_plugin"]\n',
                           "tests/unit/test_nested.py": NESTED_TEST})
    nested = pytester.runpytest("-p", "no:cacheprovider")
    assert nested.ret != 0
    nested.stdout.fnmatch_lines(["*Defining 'pytest_plugins' in a non-top-level conftest is no longer supported*"])

    (pytester.path / "tests" / "unit" / "conftest.py").write_text("")
    with_p = pytester.runpytest("-p", "no:cacheprovider", "-p", "refops.testing.pytest_plugin", "--device", "cpu")
    with_p.assert_outcomes(passed=1)

    pytester.makeini("[pytest]\naddopts = -p refops.testing.pytest_plugin\n")
    with_addopts = pytester.runpytest("-p", "no:cacheprovider", "--device", "cpu")
    with_addopts.assert_outcomes(passed=1)

    (pytester.path / "tox.ini").unlink()  # what makeini wrote
    pytester.makeconftest('pytest_plugins = ["refops.testing.pytest_plugin"]\n')
    top_level = pytester.runpytest("-p", "no:cacheprovider", "--device", "cpu")
    top_level.assert_outcomes(passed=1)


def test_the_docs_and_the_docstring_state_the_rule_and_the_alternatives():
    import pathlib

    import refops.testing.pytest_plugin as plugin

    page = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "oracle.md").read_text()
    for text in (plugin.__doc__, page):
        assert "non-top-level conftest" in text and "top-level" in text
        assert "-p refops.testing.pytest_plugin" in text and "addopts" in text
