"""benchmarks/gpu/te_tests_on_refops.py: TE's test files run on refops, and the state one test leaves for the next.

The harness runs pytest in a subprocess with a ``transformer_engine`` shim first on ``sys.path``. These tests
give it small TE-style test files: the shim must hand out refops' own objects, the CPU mode must move TE's
``device="cuda"`` defaults to the CPU, and the state watcher must report (and, asked to, undo) a fusion function
that one test leaves armed for the next: the leak of issue #31, reproduced end to end on the CPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "benchmarks" / "gpu" / "te_tests_on_refops.py"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("te_tests_on_refops_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cuda_defaults_move_to_the_cpu_through_decorators(harness):
    def helper(shape, device="cuda", other="cuda:1", dtype=torch.float32):
        return device, other

    def te_test(self, *, device: torch.device = "cuda", ref_device="cpu", tensor_device=torch.device("cuda")):
        return device, ref_device, tensor_device

    @functools.wraps(te_test)
    def decorated(*args, **kwargs):  # what @torch.inference_mode leaves: a wrapper with __wrapped__
        return te_test(*args, **kwargs)

    assert harness._move_cuda_defaults_to_cpu(helper)
    assert helper((2,)) == ("cpu", "cpu")
    assert harness._move_cuda_defaults_to_cpu(decorated)
    assert decorated(None) == ("cpu", "cpu", torch.device("cpu"))
    assert not harness._move_cuda_defaults_to_cpu(lambda x, device="cpu": x)


def test_the_shim_hands_out_refops_objects_and_named_stubs(tmp_path, harness):
    harness.write_shim(tmp_path)
    probe = textwrap.dedent(
        """
        import refops
        import transformer_engine
        import transformer_engine.pytorch as te
        import transformer_engine.pytorch.ops as te_ops
        import transformer_engine.common.recipe
        from transformer_engine.pytorch.ops.fuser import OperationFuser
        from transformer_engine.pytorch.ops.basic.grouped_linear import OUTPUT_BUFFER_KEY
        from transformer_engine.pytorch import InferenceParams, NVFP4Quantizer, is_fp8_available
        from transformer_engine.pytorch._extra_state import UNSAFE_PICKLE_EXTRA_STATE_ENV
        from transformer_engine.pytorch.attention.dot_product_attention.utils import get_attention_backend

        assert te.ops is refops.ops and te_ops is refops.ops
        assert transformer_engine.common.recipe is refops.common.recipe
        assert OperationFuser is refops.ops.fuser.OperationFuser and NVFP4Quantizer is refops.NVFP4Quantizer
        assert refops.ops.__spec__.name == "refops.ops"  # the alias did not rename refops' own module
        assert is_fp8_available(return_reason=True) == (True, "")
        assert not hasattr(refops, "InferenceParams") and not hasattr(refops, "attention")  # stubs stay outside
        for stub in (InferenceParams, get_attention_backend):
            try:
                stub()
            except NotImplementedError as error:
                assert "not part of refops" in str(error)
            else:
                raise AssertionError("a stub ran")
        try:
            import transformer_engine.pytorch.no_such_module  # noqa: F401
        except ModuleNotFoundError as error:
            assert "transformer_engine.pytorch.no_such_module" in str(error)
        else:
            raise AssertionError("an unknown TE module imported")
        print("shim ok")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(SCRIPT.parent), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "shim ok" in done.stdout


#: A TE-style test file: test_a is a custom-op test whose first forward refops refuses before fusion (as on the
#: H200 before the default-device fix), leaving its one-shot fusion armed; test_b is the training loop after it.
TE_STYLE_TESTS = '''
import torch
import transformer_engine.pytorch as te


class LinearThenSiLU(te.ops.FusedOperation):
    def __init__(self, first, second):
        super().__init__((first, second))

    def fuser_forward(self, basic_op_ctxs, input_, **unused):
        return torch.nn.functional.silu(input_ @ self.basic_ops[0].weight.t()), [(), ()]


class Armed:
    on = True


def fuse_once(ops, **unused):
    if not Armed.on:
        return ops
    Armed.on = False
    return [LinearThenSiLU(ops[0], ops[1])] + list(ops[2:])


def test_a_custom_op(*, device: torch.device = "cuda"):
    te.ops.register_forward_backward_fusion(fuse_once)
    model = te.ops.Sequential(te.ops.Linear(8, 8, bias=False, device=device), te.ops.SiLU())
    model(torch.randn(4, 8, device=device, dtype=torch.float16))  # refused: float16 input, float32 weights


def test_b_training_loop(*, device: torch.device = "cuda"):
    assert torch.device(device).type == "cpu"  # the CPU mode moved the default
    module = te.ops.Linear(8, 8, device=device)
    x = torch.rand(4, 8, device=device)
    torch.testing.assert_close(module(x), torch.nn.functional.linear(x, module.weight, module.bias))
'''


def _run_harness(tmp_path: pathlib.Path, *options: str) -> tuple[int, pathlib.Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    tests = tmp_path / "test_te_style.py"
    tests.write_text(TE_STYLE_TESTS)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tests), "--device", "cpu", "--out", str(out), *options, "--", "-q", "-p",
         "no:randomly"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert (out / "summary.txt").exists(), done.stdout + done.stderr
    return done.returncode, out


@pytest.mark.slow
def test_the_harness_reproduces_the_leak_and_isolation_stops_it(tmp_path):
    returncode, out = _run_harness(tmp_path / "as_te_runs")
    summary = (out / "summary.txt").read_text()
    assert returncode == 1 and summary.startswith("0 passed, 2 failed"), summary
    assert "test_b_training_loop: AssertionError: Tensor-likes are not close!" in summary  # the leak, on the CPU
    left = (out / "state_left_behind.log").read_text()
    assert "test_a_custom_op\tforward_backward fusion functions +fuse_once" in left

    returncode, out = _run_harness(tmp_path / "isolated", "--isolate-fusion-registry")
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("1 passed, 1 failed"), summary  # test_a still fails; test_b is no longer hit
    assert "test_a_custom_op: TypeError: BasicLinear: input has dtype torch.float16" in summary
    assert "test_b_training_loop" not in summary.split("\n", 1)[1].split("state left behind")[0]
