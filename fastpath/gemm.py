"""GEMMs on the GPU: cuBLAS through torch, per recipe as :data:`GEMM_PATHS` lists.

The contract is the reference's (``KernelBackend.gemm``): ``alpha * op(a) @ op(b)``
(``+ out`` when ``accumulate``), each quantized operand read from the usage
blocked along the contracted dim. The reference multiplies exact fp32
dequantizations in IEEE fp32; here cuBLAS accumulates in its own order (and FP8
tensor cores align partial sums to a ~13-bit accumulator), so results match the
reference within ``gemm_tols`` (plain) or ``quantization_tols`` (quantized).

Quantized operands with more than two dims are flattened to ``(rows, last
dim)``, as in the reference. Like the reference, the GEMMs read a quantized
operand only as the plain arrays of its ``gemm_operand(usage)``
(``refops.kernels.GemmOperand``, :mod:`fastpath.gemm_operands`), which may also
be passed directly. Operands the fast path does not take (CPU, mixed dtypes,
plain non-2-D, a missing usage, an RHT mismatch) go to the reference, which
also raises its errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional

import torch

from refops.kernels.gemm_numerics import SPLIT_ACCUMULATOR, gemm_numerics, gemm_role
from refops.kernels.gemm_operand import GemmOperand, dequantize_gemm_operand, is_gemm_operand_source
from refops.kernels.reference.gemm_operands import gemm_usages

from .gemm_blockwise import blockwise_scaled_mm_operands
from .gemm_epilogue import add_bias_and_round
from .gemm_operands import read_operand

__all__ = ["GemmKernels", "GemmPath", "GEMM_PATHS", "gemm_path"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class GemmPath:
    """How a recipe's GEMMs run on an sm_90 GPU, and why."""

    path: str  # "cublas", "scaled_mm" or "dequantize+cublas"
    operands: str
    reason: str


_FP8_TENSORWISE = GemmPath(
    "scaled_mm",
    "Float8Tensor x Float8Tensor",
    "cuBLAS FP8 GEMM (sm_89+) via torch._scaled_mm: row-wise data, or the column-wise (transposed) copy, "
    "so the first operand is row-major and the second column-major (.t() views); scale_a/scale_b are the "
    "tensors' scale inverses; split accumulator (use_fast_accum=False), the closest to the reference (under "
    "refops.gemm_numerics('hopper'): fprop fast accumulation, as TE and the hopper reference); alpha, "
    "out and accumulate applied to the fp32 result. Needs every dim % 16 == 0 and not E5M2 x E5M2, else "
    "dequantize + cuBLAS",
)
_NVFP4 = GemmPath(
    "dequantize+cublas",
    "NVFP4Tensor",
    "cuBLAS has no NVFP4 (E2M1 + E4M3 block scales) GEMM on sm_90 (CUBLAS_STATUS_NOT_SUPPORTED, Blackwell "
    "only): dequantize_nvfp4 to the output dtype, then torch.matmul; a column-wise RHT on both wgrad "
    "operands cancels in the product, as in the reference",
)

#: Recipe name (``refops.testing.RECIPE_NAMES``, plus "none") -> the GEMM path its operands take.
GEMM_PATHS: dict[str, GemmPath] = {
    "none": GemmPath(
        "cublas",
        "plain fp32 / fp16 / bf16 tensors",
        "torch.mm / addmm in the operands' dtype with fp32 accumulation as the reference (TF32, "
        "reduced-precision (fp16/bf16) split-K reductions and fp16 accumulation off for the call); "
        "alpha and accumulate go to cuBLAS's alpha and beta; mixed dtypes go to the reference",
    ),
    "fp8_delayed_scaling": _FP8_TENSORWISE,
    "fp8_current_scaling": _FP8_TENSORWISE,
    "mxfp8": GemmPath(
        "dequantize+cublas",
        "MXFP8Tensor",
        "cuBLAS has no MXFP8 (E8M0 block-scaled) GEMM on sm_90 (CUBLAS_STATUS_NOT_SUPPORTED, Blackwell only): "
        "dequantize_mxfp8 to the output dtype, then torch.matmul",
    ),
    "fp8_block_scaling": GemmPath(
        "scaled_mm",
        "Float8BlockwiseQTensor x Float8BlockwiseQTensor",
        "cuBLAS block-scaled FP8 GEMM (cuBLASLt 12.9+, sm_90; TE's path for Float8BlockScaling) via "
        "torch._scaled_mm's blockwise modes, 1x128 x 128x128 (fprop, dgrad) and 1x128 x 1x128 (wgrad): the "
        "scale tensors are views of refops's GEMM-ready layout (fastpath.gemm_blockwise, whose probe checks this "
        "torch and cuBLAS once per device against the exact product). Needs M, N, K % 128 == 0, not two 128x128 "
        "operands, not E5M2 x E5M2, else dequantize_float8_block to the output dtype, then torch.matmul",
    ),
    "nvfp4": _NVFP4,
    "nvfp4_4over6": _NVFP4,
}


def gemm_path(a: torch.Tensor, b: torch.Tensor, *, trans_a: bool = False, trans_b: bool = False,
              out_dtype: Optional[torch.dtype] = None) -> str:
    """The path (``GemmPath.path``) the fast path takes for these operands (``out_dtype``: the result's dtype,
    by default ``a``'s nominal dtype; block-scaled GEMMs depend on it)."""
    if not (is_gemm_operand_source(a) or is_gemm_operand_source(b)):
        return "cublas"
    a_op, b_op = _read_operands(a, b, trans_a, trans_b)
    if _scaled_mm_operands(a_op, b_op) is not None:
        return "scaled_mm"
    blockwise = blockwise_scaled_mm_operands(a_op, b_op, trans_a, trans_b, out_dtype or getattr(a, "dtype", None))
    return "scaled_mm" if blockwise is not None else "dequantize+cublas"


# ------------------------------------------------------------------ helpers
#: torch's cuBLAS switches that let fp16/bf16 GEMMs reduce partial sums in the operands' dtype
#: (cuBLAS's reduced-precision split-K reduction; both default to allowed).
_REDUCED_PRECISION_FLAGS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


def _reduction_setting(name: str) -> Any:
    """A reduced-precision flag as torch lets it be written back: ``(allow, allow_split_k)`` where
    torch has the split-K part (newer torch), else the bool."""
    matmul = torch.backends.cuda.matmul
    allow = getattr(matmul, name)
    split_k = getattr(matmul, name + "_split_k", None)  # older torch: AttributeError, hence None
    return allow if split_k is None else (allow, split_k)


@contextlib.contextmanager
def _fp32_accumulation() -> Iterator[None]:
    """cuBLAS as the reference's GEMM: fp32 products and sums, one rounding to the output dtype.

    For the duration: TF32 off (fp32 operands), reduced-precision reductions off (fp16/bf16
    operands: split-K partial sums stay fp32; split-K itself keeps the caller's setting, its
    fp32 partial sums only reorder the accumulation) and fp16 accumulation off. The caller's
    settings are restored afterwards, also on error.
    """
    matmul = torch.backends.cuda.matmul
    saved = {name: _reduction_setting(name) for name in _REDUCED_PRECISION_FLAGS}
    saved["allow_tf32"] = matmul.allow_tf32
    fp16_accumulation = getattr(matmul, "allow_fp16_accumulation", None)  # torch 2.7+
    if fp16_accumulation is not None:
        saved["allow_fp16_accumulation"] = fp16_accumulation
    try:
        matmul.allow_tf32 = False
        for name in _REDUCED_PRECISION_FLAGS:
            setting = saved[name]
            setattr(matmul, name, (False, setting[1]) if isinstance(setting, tuple) else False)
        if fp16_accumulation is not None:
            matmul.allow_fp16_accumulation = False
        yield
    finally:
        for name, value in saved.items():
            setattr(matmul, name, value)


def _mm(a2: torch.Tensor, b2: torch.Tensor, *, alpha: float, out: Optional[torch.Tensor],
        accumulate: bool) -> torch.Tensor:
    """``alpha * a2 @ b2 (+ out)`` by cuBLAS in the operands' dtype (= ``out``'s): fp32
    accumulation, one rounding (see :func:`_fp32_accumulation`)."""
    with _fp32_accumulation():
        if accumulate and out.dtype in (torch.float16, torch.bfloat16):
            # The reference rounds once: RN(RN(alpha * acc) + out) in fp32, then to out's dtype.
            # cuBLAS's beta = 1 epilogue may round the product first, so add in fp32 here.
            acc = _mm_fp32_out(a2, b2)
            product = acc if alpha == 1.0 else acc * alpha
            return out.copy_(product + out.float())
        if accumulate:
            return out.addmm_(a2, b2, alpha=alpha)
        if out is None:
            out = torch.empty((a2.shape[0], b2.shape[1]), dtype=a2.dtype, device=a2.device)
        if alpha == 1.0:
            return torch.mm(a2, b2, out=out)
        return torch.addmm(out, a2, b2, beta=0.0, alpha=alpha, out=out)


def _mm_fp32_out(a2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """``a2 @ b2`` accumulated and returned in fp32 (cuBLAS reads the 16-bit operands directly)."""
    try:
        return torch.mm(a2, b2, out_dtype=torch.float32)
    except (TypeError, RuntimeError):  # torch without mm(out_dtype=...)
        return torch.mm(a2.float(), b2.float())


def _fp32_result_of_16bit_operands(a: torch.Tensor, b: torch.Tensor, target: torch.dtype,
                                    out: Optional[torch.Tensor], accumulate: bool) -> bool:
    """An fp32 result asked of fp16/bf16 operands (plain, or quantized with that nominal dtype).

    Fusions that round once ask for it (``refops.ops.fused.one_rounding``), as TE's GEMM epilogues keep
    the fp32 accumulator. cuBLAS then reads the 16-bit operands and writes fp32: an fp32 GEMM of upcast
    operands would compute the same products at a fraction of the tensor cores' 16-bit speed.
    """
    # A GemmOperand given directly has no nominal dtype: its GEMM runs from fp32 values.
    a_dtype, b_dtype = getattr(a, "dtype", None), getattr(b, "dtype", None)
    return (target == torch.float32 and out is None and not accumulate and a_dtype == b_dtype
            and a_dtype in (torch.float16, torch.bfloat16))


def _mm_fp32_result(a2: torch.Tensor, b2: torch.Tensor, *, alpha: float) -> torch.Tensor:
    """``alpha * a2 @ b2`` in fp32 from 16-bit operands: fp32 accumulation, ``alpha`` applied in fp32."""
    with _fp32_accumulation():
        acc = _mm_fp32_out(a2, b2)
    return acc if alpha == 1.0 else acc * alpha


def _read_operands(a: Any, b: Any, trans_a: bool, trans_b: bool) -> tuple[Any, Any]:
    """``(a, b)`` with each quantized operand replaced by its ``GemmOperand`` in the usage the GEMM reads (None
    where the fast path does not take it: see :func:`fastpath.gemm_operands.read_operand`); plain tensors as
    they are."""
    usages = gemm_usages(trans_a, trans_b)
    a_op, b_op = (read_operand(t, usages[name], name) if is_gemm_operand_source(t) else t
                  for name, t in (("a", a), ("b", b)))
    return a_op, b_op


def _output_columns(b: Any, trans_b: bool) -> int:
    """The columns of ``op(b)`` (-1 for a tensor of fewer than 2 dims): what a bias must match."""
    if isinstance(b, GemmOperand):
        return b.shape[0] if trans_b else b.shape[1]
    return (b.shape[0] if trans_b else b.shape[-1]) if b.dim() >= 2 else -1


def _is_float8(t: Any) -> bool:
    return isinstance(t, GemmOperand) and t.format == "float8"


def _contiguous(data: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return data if data is not None and data.is_contiguous() else None


def _scaled_mm_operands(a: Any, b: Any):
    """``(mat1, mat2, scale_a, scale_b)`` for ``torch._scaled_mm`` of two per-tensor FP8 operands read in the
    GEMM's usages (``GemmOperand``), or None if the pair does not qualify."""
    if not (_is_float8(a) and _is_float8(b)):
        return None
    if not (a.device.type == "cuda" and torch.cuda.get_device_capability(a.device) >= (8, 9)):
        return None
    if (a.fp8_dtype, b.fp8_dtype) == (torch.float8_e5m2, torch.float8_e5m2):
        return None  # cuBLAS has no E5M2 x E5M2 GEMM
    # Each operand's bytes have the contracted dim last (the row-wise data or the transposed copy): op(a) is
    # row-major either way, and the .t() view of op(b)'s row-major bytes is the column-major operand cuBLAS wants.
    a_data, b_data = _contiguous(a.data), _contiguous(b.data)
    if a_data is None or b_data is None:
        return None
    mat1, mat2 = a_data.view(a.fp8_dtype), b_data.view(b.fp8_dtype).t()
    m, k = mat1.shape
    n = mat2.shape[1]
    if min(m, k, n) == 0 or m % 16 or k % 16 or n % 16:
        return None
    return mat1, mat2, a.scale_inv.reshape(()).float(), b.scale_inv.reshape(()).float()


def _fast_accumulation(a: Any, b: Any, role: Optional[str], trans_a: bool, trans_b: bool) -> bool:
    """``use_fast_accum`` of a per-tensor FP8 ``_scaled_mm``: the split accumulator (False, the closest to
    the exact reference), except under ``refops.gemm_numerics("hopper")``, where each role gets the
    accumulation of TE's per-tensor recipes (fprop fast) so that the GPU computes what the reference models."""
    if gemm_numerics() != "hopper" or not (_is_float8(a) and _is_float8(b)):
        return False
    return not SPLIT_ACCUMULATOR[gemm_role(role, trans_a=trans_a, trans_b=trans_b)]


class GemmKernels:
    """Mixin overriding ``gemm`` of ``KernelBackend`` (see :data:`GEMM_PATHS`)."""

    def gemm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        out_dtype: torch.dtype,
        alpha: float = 1.0,
        out: Optional[torch.Tensor] = None,
        accumulate: bool = False,
        role: Optional[str] = None,
        bias: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        kwargs = dict(trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype, alpha=alpha, out=out,
                      accumulate=accumulate, role=role)
        target = out.dtype if out is not None else out_dtype
        operands = self._fast_operands(a, b, out, accumulate, target, trans_a, trans_b)
        if operands is None:
            return super().gemm(a, b, bias=bias, **kwargs) if bias is not None else super().gemm(a, b, **kwargs)
        a_op, b_op = operands
        if bias is not None:
            return self._gemm_bias(a, b, a_op, b_op, bias, target=target, **kwargs)
        quantized = isinstance(a_op, GemmOperand) or isinstance(b_op, GemmOperand)
        wide = _fp32_result_of_16bit_operands(a, b, target, out, accumulate)
        if not quantized:
            if wide:
                return _mm_fp32_result(a.t() if trans_a else a, b.t() if trans_b else b, alpha=alpha)
            if a.dtype != b.dtype or a.dtype != target:
                return super().gemm(a, b, **kwargs)
            result = _mm(a.t() if trans_a else a, b.t() if trans_b else b, alpha=alpha, out=out,
                         accumulate=accumulate)
        else:
            mm_operands = _scaled_mm_operands(a_op, b_op)
            if mm_operands is None:  # FP8 block scaling: cuBLAS's block-scaled GEMM where it takes the pair
                scaled_mm_out = target if alpha == 1.0 and not accumulate else torch.float32  # as _scaled_mm below
                mm_operands = blockwise_scaled_mm_operands(a_op, b_op, trans_a, trans_b, scaled_mm_out)
            if mm_operands is not None:
                return self._scaled_mm(mm_operands, target=target, alpha=alpha, out=out, accumulate=accumulate,
                                       use_fast_accum=_fast_accumulation(a_op, b_op, role, trans_a, trans_b))
            operand_dtype = a.dtype if wide else target  # the operands' nominal 16-bit dtype for an fp32 result
            a2 = self._dequantized(a_op, operand_dtype)
            b2 = self._dequantized(b_op, operand_dtype)
            if wide:
                return _mm_fp32_result(a2.t() if trans_a else a2, b2.t() if trans_b else b2, alpha=alpha)
            result = _mm(a2.t() if trans_a else a2, b2.t() if trans_b else b2, alpha=alpha, out=out,
                         accumulate=accumulate)
        return result if out is None else out

    def _gemm_bias(self, a, b, a_op, b_op, bias: torch.Tensor, *, target: torch.dtype, trans_a: bool,
                   trans_b: bool, out_dtype: torch.dtype, alpha: float, out: Optional[torch.Tensor], accumulate: bool,
                   role: Optional[str]) -> torch.Tensor:
        """``gemm(..., bias=bias)``: the bias in cuBLAS's epilogue (``addmm`` / ``_scaled_mm(bias=)``), added
        to the fp32 accumulator before the one rounding, where cuBLAS takes it: a 16-bit result, a bias of
        that dtype, no ``out``/``accumulate``. Elsewhere the fp32 result, the bias added in fp32, one
        rounding: the reference's arithmetic, and no more memory traffic than before the ``bias`` keyword.
        ``a_op``, ``b_op``: ``a`` and ``b`` as :meth:`_fast_operands` read them."""
        kwargs = dict(trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype, alpha=alpha, out=out,
                      accumulate=accumulate, role=role)
        n = _output_columns(b, trans_b)
        if not (bias.dim() == 1 and bias.shape[0] == n and bias.is_cuda and bias.device == a.device):
            return super().gemm(a, b, bias=bias, **kwargs)  # the reference names the problem
        epilogue = (out is None and not accumulate and bias.dtype == target
                    and target in (torch.float16, torch.bfloat16) and bias.is_contiguous())
        if epilogue:
            quantized = isinstance(a_op, GemmOperand) or isinstance(b_op, GemmOperand)
            operands = _scaled_mm_operands(a_op, b_op) if quantized else None
            if operands is not None and alpha == 1.0:
                mat1, mat2, scale_a, scale_b = operands
                return torch._scaled_mm(mat1, mat2, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=target,
                                        use_fast_accum=_fast_accumulation(a_op, b_op, role, trans_a, trans_b))
            if operands is None and not (quantized and self._blockwise(a_op, b_op, trans_a, trans_b, target)):
                if quantized:
                    a = self._dequantized(a_op, target)
                    b = self._dequantized(b_op, target)
                if a.dtype == b.dtype == target:
                    with _fp32_accumulation():
                        return torch.addmm(bias, a.t() if trans_a else a, b.t() if trans_b else b, alpha=alpha)
        if out is None and not accumulate:
            wide = self.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.float32, alpha=alpha, role=role)
            return add_bias_and_round(wide, bias, target)
        return super().gemm(a, b, bias=bias, **kwargs)

    @staticmethod
    def _blockwise(a_op, b_op, trans_a: bool, trans_b: bool, target: torch.dtype) -> bool:
        """Whether the pair runs as one block-scaled cuBLAS GEMM into ``target`` (which takes no bias)."""
        return blockwise_scaled_mm_operands(a_op, b_op, trans_a, trans_b, target) is not None

    @staticmethod
    def _fast_operands(a, b, out, accumulate, target, trans_a, trans_b) -> Optional[tuple[Any, Any]]:
        """``(a, b)`` as the fast path reads them, each quantized operand as its ``GemmOperand`` in the usage the
        GEMM reads (plain ones as they are); None where the reference runs the GEMM. The fast path takes CUDA
        operands on one device (plain ones 2-D, quantized ones 2-D or N-D flattened to ``(rows, last dim)``), a
        float result, every usage the GEMM reads present, both operands in or out of the Hadamard domain."""
        if target not in _FLOATS or (accumulate and out is None):
            return None
        devices = [t.device for t in (a, b, out) if t is not None]
        if not all(d.type == "cuda" and d == devices[0] for d in devices):
            return None
        a_op, b_op = _read_operands(a, b, trans_a, trans_b)
        for t, op in ((a, a_op), (b, b_op)):
            if is_gemm_operand_source(t):
                if op is None:
                    return None
            elif t.dtype not in _FLOATS or t.dim() != 2:
                return None
        hadamard = [isinstance(op, GemmOperand) and op.hadamard for op in (a_op, b_op)]
        return (a_op, b_op) if hadamard[0] == hadamard[1] else None

    def _dequantized(self, t: Any, dtype: torch.dtype) -> torch.Tensor:
        """``t`` in ``dtype``: a ``GemmOperand`` dequantized by this backend's kernels, ``(rows, last dim)``."""
        if isinstance(t, GemmOperand):
            return dequantize_gemm_operand(t, self, dtype)
        return t if t.dtype == dtype else t.to(dtype)

    @staticmethod
    def _scaled_mm(operands, *, target: torch.dtype, alpha: float, out: Optional[torch.Tensor],
                   accumulate: bool, use_fast_accum: bool = False) -> torch.Tensor:
        mat1, mat2, scale_a, scale_b = operands
        direct = alpha == 1.0 and not accumulate
        result = torch._scaled_mm(mat1, mat2, scale_a=scale_a, scale_b=scale_b,
                                  out_dtype=target if direct else torch.float32, use_fast_accum=use_fast_accum)
        if not direct:
            if alpha != 1.0:
                result = result * alpha
            if accumulate:
                result = result + out.float()
            result = result.to(target)
        if out is None:
            return result
        out.copy_(result)
        return out
