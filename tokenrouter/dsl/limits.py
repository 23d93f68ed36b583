"""The numbers of the language and of a plan: what the runtime's tensors hold. Every int is an int64 (literals,
params, options, route constants); a route constant of type float is a float32 in the route kernel; no value is
infinite or NaN."""

from __future__ import annotations

import math
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38


def shown_number(value: Any) -> str:
    """A number for a message, a very long int cut short (`str` refuses an int of more than 4,300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        digits = math.floor(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}an int of about {digits} digits"
    return repr(value)


def value_problem(value: Any) -> str | None:
    """Why `value` (an evaluated constant) cannot be in a plan; None when it can."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return f"{shown_number(value)} is beyond the 64-bit int range [-2^63, 2^63 - 1]"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    return None


def route_constant_problem(value: Any) -> str | None:
    """Why `value` cannot be a constant of the route kernel (int64 or float32); None when it can."""
    problem = value_problem(value)
    if problem is None and isinstance(value, float) and abs(value) > FLOAT32_MAX:
        return f"{value!r} is beyond the route kernel's float32 range (±3.4e38)"
    return problem
