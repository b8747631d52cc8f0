"""One way to say "this input is wrong": the field, the value received, what is allowed, and the fix."""

from __future__ import annotations

from typing import Any


class SemSpecConfigError(ValueError):
    """Raised before any decoding starts when an argument of `generate()` or a rule/policy config is invalid.

    Subclasses `ValueError`, so `except ValueError` keeps working for callers of transformers' `generate()`.
    """


def invalid_value(field: str, value: Any, allowed: str, fix: str) -> SemSpecConfigError:
    """Builds the error for one bad field.

    Args:
        field (`str`): the argument as the user wrote it, e.g. ``"acceptance_kwargs['window']"``.
        value (`Any`): what was received.
        allowed (`str`): the allowed values or range, in words.
        fix (`str`): what to do instead.
    """
    return SemSpecConfigError(f"`{field}` = {value!r} is not valid: allowed {allowed}. Fix: {fix}")
