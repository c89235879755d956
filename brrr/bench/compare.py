"""Is a backend's result the same function as eager's? Error metrics and the pass/fail rule of bench.

- `flatten_tensors(value)`: the tensors inside a model's output (tensors, tuples, lists, dicts, HF ModelOutput).
- `Error`: max abs, max rel (max abs over the reference's largest magnitude) and ‖a − b‖ / ‖b‖ over all
  tensors compared; NaN or Inf where the reference is finite counts as an infinite error.
- `verdict(...)`: fp32/fp64 pass when ‖a − b‖ / ‖b‖ <= 1e-4 against eager. Half types (bf16/fp16) are
  judged against a run of the same model in a higher precision (float64 by default; the zoo uses float32 for
  models too large for it): the backend's error may be at most 3x eager's own error against that reference
  (floored at the dtype's epsilon, so an eager that happens to be near-exact doesn't fail everyone).
"""

import math
from dataclasses import dataclass

import torch

FP32_RTOL = 1e-4
HALF_FACTOR = 3.0
HALF_TYPES = (torch.float16, torch.bfloat16)


def flatten_tensors(value):
    """Every tensor in `value`, in a stable order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten_tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    if hasattr(value, "to_tuple"):
        return flatten_tensors(value.to_tuple())
    return []


@dataclass(frozen=True)
class Error:
    max_abs: float
    max_rel: float    # max |a - b| / max |b|
    norm_rel: float   # ||a - b|| / ||b|| over all compared tensors

    def to_dict(self):
        return {"max_abs": self.max_abs, "max_rel": self.max_rel, "norm_rel": self.norm_rel}

    @staticmethod
    def exact():
        return Error(0.0, 0.0, 0.0)


INFINITE = Error(math.inf, math.inf, math.inf)


def error(actual, reference):
    """Error of the tensors in `actual` against those in `reference` (compared in float64)."""
    actual, reference = flatten_tensors(actual), flatten_tensors(reference)
    if len(actual) != len(reference):
        return INFINITE
    max_abs = ref_max = diff_sq = ref_sq = 0.0
    for a, b in zip(actual, reference):
        if a.shape != b.shape:
            return INFINITE
        if not (a.is_floating_point() or a.is_complex()):
            if not torch.equal(a.cpu(), b.cpu().to(a.dtype)):
                return INFINITE
            continue
        a, b = a.detach().to(torch.float64), b.detach().to(device=a.device, dtype=torch.float64)
        finite_ref = torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), finite_ref):
            return INFINITE
        if not finite_ref.all():  # same non-finite pattern: compare where both are finite
            same = torch.equal(a[~finite_ref].nan_to_num(), b[~finite_ref].nan_to_num())
            if not same:
                return INFINITE
            a, b = a[finite_ref], b[finite_ref]
        if a.numel() == 0:
            continue
        diff = (a - b).abs()
        max_abs = max(max_abs, diff.max().item())
        ref_max = max(ref_max, b.abs().max().item())
        diff_sq += diff.square().sum().item()
        ref_sq += b.square().sum().item()
    if diff_sq == 0.0:
        return Error.exact()
    tiny = 1e-300
    return Error(max_abs, max_abs / max(ref_max, tiny), math.sqrt(diff_sq) / max(math.sqrt(ref_sq), tiny))


def half_limit(eager_vs_reference, dtype):
    """The largest error vs the reference a half-precision backend may show: 3x eager's own, floored at eps."""
    return max(HALF_FACTOR * eager_vs_reference, torch.finfo(dtype).eps)


def verdict(dtype, vs_eager, vs_reference=None, eager_vs_reference=None, reference_name="fp64"):
    """None when the result is within tolerance, else a short 'WRONG: ...' reason."""
    if dtype in HALF_TYPES and vs_reference is not None and eager_vs_reference is not None:
        limit = half_limit(eager_vs_reference.norm_rel, dtype)
        if not vs_reference.norm_rel <= limit:
            return (f"WRONG: error vs {reference_name} {vs_reference.norm_rel:.2e} > {limit:.2e} "
                    f"(3x eager's {eager_vs_reference.norm_rel:.2e})")
        return None
    if dtype in HALF_TYPES:  # no higher-precision reference could be made: judge against eager at a few ulps
        limit = 4 * torch.finfo(dtype).eps
        if not vs_eager.norm_rel <= limit:
            return f"WRONG: error {vs_eager.norm_rel:.2e} > {limit:.1e} vs eager (no higher-precision reference)"
        return None
    if not vs_eager.norm_rel <= FP32_RTOL:
        return f"WRONG: error {vs_eager.norm_rel:.2e} > {FP32_RTOL:.0e} vs eager"
    return None
