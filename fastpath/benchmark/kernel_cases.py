"""Part (a): every quantize/dequantize, activation and norm kernel on one large bf16 tensor.

Each case is a backend method and its arguments, built outside the timed region.
Bytes = the distinct input tensors read plus the distinct output tensors
written (an output that is an input, or the same tensor twice, counts once); an
argument the kernel never reads (``Case.unread``) is not charged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from refops.kernels import ReferenceKernels

from .timing import median_ms, tensors_in, unique_bytes

__all__ = ["Case", "KernelResult", "charged_bytes", "measure_copy", "kernel_cases", "run_cases"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@dataclasses.dataclass
class KernelResult:
    name: str
    family: str
    method: str
    implementation: str  # "fastpath" (a CUDA kernel) or "reference" (falls back to torch ops)
    ms: float
    reps: int
    bytes: int

    @property
    def gbps(self) -> float:
        return self.bytes / (self.ms * 1e-3) / 1e9

    def as_dict(self, copy_gbps: float) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "gbps": round(self.gbps, 1),
                "pct_of_copy": round(100 * self.gbps / copy_gbps, 1)}


@dataclasses.dataclass
class Case:
    name: str
    family: str
    method: str
    args: tuple
    kwargs: dict
    #: what to time instead of the backend method (one kernel of a multi-kernel method), called as the method is
    fn: Callable[..., Any] | None = None
    #: positions in ``args`` of tensors the kernel never reads (x of the identity's backward): not charged
    unread: tuple[int, ...] = ()

    def callable_on(self, backend: Any) -> Callable[[], Any]:
        """The call this case times: ``fn`` when given (one kernel of a method), else the backend's method."""
        fn = self.fn or getattr(backend, self.method)
        return lambda: fn(*self.args, **self.kwargs)


def charged_bytes(case: Case, result: Any) -> int:
    """Bytes a call of ``case`` must move: the distinct tensors it reads, plus its distinct new outputs."""
    read = tuple(a for i, a in enumerate(case.args) if i not in case.unread)
    inputs = tensors_in((case.args, case.kwargs))
    return unique_bytes((read, case.kwargs)) + unique_bytes(result, exclude=list(inputs))


def measure_copy(x: torch.Tensor) -> KernelResult:
    """Device-to-device copy of ``x``: the bandwidth every kernel is compared with (2 x bytes / time)."""
    dst = torch.empty_like(x)
    ms, reps = median_ms(lambda: dst.copy_(x), reps=30)
    return KernelResult("copy (D2D)", "copy", "Tensor.copy_", "torch", ms, reps, 2 * x.numel() * x.element_size())


def implementation(backend: Any, method: str) -> str:
    own = getattr(type(backend), method)
    base = getattr(ReferenceKernels, method)
    return "reference" if getattr(own, "__wrapped__", own) is getattr(base, "__wrapped__", base) else "fastpath"


def measure_case(backend: Any, case: Case) -> KernelResult:
    call = case.callable_on(backend)
    result = call()
    moved = charged_bytes(case, result)
    del result
    ms, reps = median_ms(call)
    impl = "fastpath" if case.fn is not None else implementation(backend, case.method)
    return KernelResult(case.name, case.family, case.method, impl, ms, reps, moved)


# ------------------------------------------------------------------- cases
def kernel_cases(backend: Any, x: torch.Tensor, activations: tuple[str, ...], params: dict[str, dict]) -> list[Case]:
    """Every case on ``x`` (rows x cols, bf16). Dequantize inputs are quantized by ``backend`` here."""
    return [*_quantize_cases(backend, x), *_activation_cases(x, activations, params), *_norm_cases(x)]


def _quantize_cases(backend: Any, x: torch.Tensor) -> list[Case]:
    m, k = x.shape
    scale = backend.compute_scale_from_amax(backend.amax(x), fmax=448.0, force_pow_2_scales=False,
                                            amax_epsilon=0.0, value_for_inf=torch.finfo(torch.float32).max)
    acc = torch.zeros(1, dtype=torch.float32, device=x.device)
    q = "quantize"
    cases = [
        Case("amax (current scaling, pass 1)", q, "amax", (x,), {}),
        Case("float8 e4m3 row+col (x, w)", q, "quantize_float8", (x, scale),
             dict(fp8_dtype=E4M3, rowwise=True, columnwise=True)),
        Case("float8 e4m3 row only", q, "quantize_float8", (x, scale),
             dict(fp8_dtype=E4M3, rowwise=True, columnwise=False)),
        Case("float8 e5m2 row+col + amax record (delayed dy)", q, "quantize_float8", (x, scale),
             dict(fp8_dtype=E5M2, rowwise=True, columnwise=True, amax_accumulator=acc)),
    ]
    for usage, (r, c) in {"row+col": (True, True), "row": (True, False), "col": (False, True)}.items():
        cases.append(Case(f"mxfp8 e4m3 {usage}", q, "quantize_mxfp8", (x,),
                          dict(fp8_dtype=E4M3, rowwise=r, columnwise=c)))
    cases.append(Case("mxfp8 e4m3 32x32 (2D) row+col", q, "quantize_mxfp8", (x,),
                      dict(fp8_dtype=E4M3, rowwise=True, columnwise=True, with_2d_quantization=True)))
    for dim, role in ((1, "x, dy"), (2, "w")):
        cases.append(Case(f"float8 block {'1x128' if dim == 1 else '128x128'} row+col ({role})", q,
                          "quantize_float8_block", (x,),
                          dict(fp8_dtype=E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim,
                               force_pow_2_scales=True, amax_epsilon=0.0)))
    gen = torch.Generator(device=x.device).manual_seed(0)
    rand_row = torch.randint(0, 256, (m, k), dtype=torch.uint8, device=x.device, generator=gen)
    rand_col = torch.randint(0, 256, (k, m), dtype=torch.uint8, device=x.device, generator=gen)
    cases += [
        Case("nvfp4 1x16 row+col (x)", q, "quantize_nvfp4", (x,), dict(rowwise=True, columnwise=True)),
        Case("nvfp4 16x16 (2D) row+col (w)", q, "quantize_nvfp4", (x,),
             dict(rowwise=True, columnwise=True, with_2d_quantization=True)),
        Case("nvfp4 row + RHT col (x, recipe default)", q, "quantize_nvfp4", (x,),
             dict(rowwise=True, columnwise=True, with_rht=True)),
        Case("nvfp4 SR row + RHT col (dy, recipe default)", q, "quantize_nvfp4", (x,),
             dict(rowwise=True, columnwise=True, with_rht=True, stochastic_rounding=True,
                  random_bytes_rowwise=rand_row, random_bytes_columnwise=rand_col)),
        Case("nvfp4 4over6 row+col", q, "quantize_nvfp4", (x,),
             dict(rowwise=True, columnwise=True, use_4over6=True, e4m3_max_4over6=256.0)),
    ]
    if implementation(backend, "quantize_nvfp4") == "fastpath":
        cases += _nvfp4_pass_cases(x, rand_row, rand_col)
    return cases + _dequantize_cases(backend, x, scale)


def _nvfp4_pass_cases(x: torch.Tensor, rand_row: torch.Tensor, rand_col: torch.Tensor) -> list[Case]:
    """The fast path's two NVFP4 kernels timed apart, as the FP8 current-scaling amax and cast are.

    Pass 1 reads x for the global amax(es) (with the RHT, also the amax of the RHT outputs); pass 2, given
    them, reads x again and writes both orientations' data and block scales.
    """
    from ..quantize_nvfp4 import nvfp4_cast, nvfp4_global_amaxes

    q = "quantize"
    plain = nvfp4_global_amaxes(x, rowwise=True, columnwise=True, rht=False, sign_mask=True)
    rht = nvfp4_global_amaxes(x, rowwise=True, columnwise=True, rht=True, sign_mask=True)
    both = dict(rowwise=True, columnwise=True, two_d=False, rht=False, sign_mask=True, random_rowwise=None,
                random_columnwise=None, use_4over6=False, e4m3_max=448.0, mse=False)
    passes = [
        ("nvfp4 pass 1: amax", nvfp4_global_amaxes, (x,), dict(rowwise=True, columnwise=True, rht=False,
                                                                 sign_mask=True)),
        ("nvfp4 pass 1: amax + RHT amax", nvfp4_global_amaxes, (x,), dict(rowwise=True, columnwise=True, rht=True,
                                                                            sign_mask=True)),
        ("nvfp4 1x16 row+col (x), pass 2", nvfp4_cast, (x, plain), both),
        ("nvfp4 16x16 (2D) row+col (w), pass 2", nvfp4_cast, (x, plain), {**both, "two_d": True}),
        ("nvfp4 row + RHT col (x), pass 2", nvfp4_cast, (x, rht), {**both, "rht": True}),
        ("nvfp4 SR row + RHT col (dy), pass 2", nvfp4_cast, (x, rht),
         {**both, "rht": True, "random_rowwise": rand_row, "random_columnwise": rand_col}),
        ("nvfp4 4over6 row+col, pass 2", nvfp4_cast, (x, plain), {**both, "use_4over6": True, "e4m3_max": 256.0}),
        # the remaining pass-2 kernels (sr, 2d_sr, 4o6_2d): option sets the recipe does not use by default
        ("nvfp4 SR row+col, pass 2", nvfp4_cast, (x, plain),
         {**both, "random_rowwise": rand_row, "random_columnwise": rand_col}),
        ("nvfp4 16x16 (2D) SR row+col, pass 2", nvfp4_cast, (x, plain),
         {**both, "two_d": True, "random_rowwise": rand_row, "random_columnwise": rand_col}),
        ("nvfp4 4over6 16x16 (2D) row+col, pass 2", nvfp4_cast, (x, plain),
         {**both, "two_d": True, "use_4over6": True, "e4m3_max": 256.0}),
    ]
    return [Case(name, q, "quantize_nvfp4", args, kwargs, fn=fn) for name, fn, args, kwargs in passes]


def _dequantize_cases(backend: Any, x: torch.Tensor, scale: torch.Tensor) -> list[Case]:
    d, bf16 = "dequantize", torch.bfloat16
    row, scale_inv, col, _ = backend.quantize_float8(x, scale, fp8_dtype=E4M3, rowwise=True, columnwise=True)
    cases = [Case("float8 e4m3 -> bf16", d, "dequantize_float8", (row, scale_inv),
                  dict(fp8_dtype=E4M3, out_dtype=bf16))]
    mx = backend.quantize_mxfp8(x, fp8_dtype=E4M3, rowwise=True, columnwise=True)
    for usage, (data, s) in {"row": mx[0:2], "col": mx[2:4]}.items():
        cases.append(Case(f"mxfp8 {usage} -> bf16", d, "dequantize_mxfp8", (data, s),
                          dict(fp8_dtype=E4M3, columnwise=usage == "col", out_dtype=bf16)))
    for dim in (1, 2):
        blk = backend.quantize_float8_block(x, fp8_dtype=E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim,
                                            force_pow_2_scales=True, amax_epsilon=0.0)
        for usage, (data, s) in {"row": blk[0:2], "col": blk[2:4]}.items():
            cases.append(Case(f"float8 block dim{dim} {usage} -> bf16", d, "dequantize_float8_block", (data, s),
                              dict(fp8_dtype=E4M3, columnwise=usage == "col", block_scaling_dim=dim,
                                   out_dtype=bf16)))
    nv = backend.quantize_nvfp4(x, rowwise=True, columnwise=True)
    for usage, (data, s, amax) in {"row": nv[0:3], "col": nv[3:6]}.items():
        cases.append(Case(f"nvfp4 {usage} -> bf16", d, "dequantize_nvfp4", (data, s, amax),
                          dict(shape=tuple(x.shape), columnwise=usage == "col", e4m3_max=448.0, out_dtype=bf16)))
    return cases


def _activation_cases(x: torch.Tensor, activations: tuple[str, ...], params: dict[str, dict]) -> list[Case]:
    from ..elementwise import GATED_ACTIVATIONS

    bias = (torch.randn(x.shape[-1], device=x.device) * 0.1).to(x.dtype)
    dy_full = torch.randn_like(x)
    dy_half = dy_full[:, : x.shape[-1] // 2].contiguous()
    cases = []
    for act in activations:
        p = params.get(act, {})
        dy = dy_half if act in GATED_ACTIVATIONS else dy_full
        cases += [
            Case(f"{act} forward", "activation", "activation_forward", (x, act), p),
            Case(f"{act} backward", "activation", "activation_backward", (dy, x, act), p,
                 unread=(1,) if act == "identity" else ()),  # the identity's derivative never reads x
            Case(f"bias + {act} forward", "bias+activation", "bias_activation_forward", (x, bias, act), p),
        ]
    for act in ("gelu", "relu"):  # the BackwardActivationBias fusion
        cases.append(Case(f"{act} backward + dbias", "bias+activation", "activation_backward_dbias",
                          (dy_full, x, act), {}))
    cases.append(Case("dbias", "bias+activation", "dbias", (dy_full,), {}))
    return cases


def _norm_cases(x: torch.Tensor) -> list[Case]:
    n = x.shape[-1]
    w = (1 + 0.1 * torch.randn(n, device=x.device)).to(x.dtype)
    b = (0.1 * torch.randn(n, device=x.device)).to(x.dtype)
    dy = torch.randn_like(x)
    ref = ReferenceKernels()
    _, mean, rstd = ref.layer_norm_forward(x, w, b, eps=1e-5, zero_centered_gamma=False, out_dtype=x.dtype)
    _, rms_rstd = ref.rms_norm_forward(x, w, eps=1e-5, zero_centered_gamma=False, out_dtype=x.dtype)
    _, rnorm = ref.l2_normalize_forward(x, eps=1e-6)
    kw = dict(zero_centered_gamma=False)
    return [
        Case("LayerNorm forward", "norm", "layer_norm_forward", (x, w, b), dict(eps=1e-5, out_dtype=x.dtype, **kw)),
        Case("LayerNorm backward", "norm", "layer_norm_backward", (dy, x, mean, rstd, w), kw),
        Case("RMSNorm forward", "norm", "rms_norm_forward", (x, w), dict(eps=1e-5, out_dtype=x.dtype, **kw)),
        Case("RMSNorm backward", "norm", "rms_norm_backward", (dy, x, rms_rstd, w), kw),
        Case("L2Normalization forward", "norm", "l2_normalize_forward", (x,), dict(eps=1e-6)),
        Case("L2Normalization backward", "norm", "l2_normalize_backward", (dy, x, rnorm), dict(eps=1e-6)),
    ]


def run_cases(backend: Any, cases: list[Case], log: Callable[[str], None]) -> list[KernelResult]:
    results = []
    for case in cases:
        try:
            result = measure_case(backend, case)
        except Exception as exc:  # keep measuring the others; the report says what failed
            log(f"  {case.name}: FAILED ({type(exc).__name__}: {exc})")
            continue
        log(f"  {case.name:<48} {result.ms:8.3f} ms {result.gbps:8.0f} GB/s  [{result.implementation}]")
        results.append(result)
    return results
