"""The three ways in, and no silent fallback in between.

- `hf_semspec.attach(model)`: this one instance (`generation.attach`).
- `hf_semspec.enable()` / `hf_semspec.disable()`: every model of the process, including those a `pipeline` loads from
  a path, in the spirit of liger-kernel's `apply_liger_kernel_to_*` (explicit, process-wide, reversible).
- a Hub `custom_generate` repo: `generate(custom_generate="<repo>", trust_remote_code=True, ...)`.

And, from `import hf_semspec` on, a guard on transformers' `generate()`: a call on a model that none of the three
covers, which names a rule that would decode (`generation.field_that_needs_hf_semspec`), raises an error naming the
fixes, rather than transformers' "model_kwargs are not used" or, for a rule in a generation config, silent plain
decoding. A call without our fields goes straight on to transformers' `generate()` with its arguments untouched.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from . import _transformers_compat as compat
from .errors import SemSpecConfigError
from .generation import _STOCK_CALL, _handing_to_transformers, field_that_needs_hf_semspec, generate

_MARK = "__hf_semspec__"  # on the functions this module installs: "guard" or "enabled"
_replaced_by_enable: list[Callable] = []  # what `enable()` replaced, for `disable()` (empty while not enabled)


def _parameters(function: Callable) -> tuple[str, ...]:
    """The names of `function`'s parameters after `self`, in order: where each sits when passed positionally."""
    return tuple(inspect.signature(function).parameters)[1:]


def _argument(parameters: tuple[str, ...], args: tuple, kwargs: dict, name: str) -> Any:
    """The argument `name` of a call `(self, *args, **kwargs)` to a function with `parameters`."""
    position = parameters.index(name) if name in parameters else len(args)
    return args[position] if len(args) > position else kwargs.get(name)


def _guarded(stock_generate: Callable) -> Callable:
    """transformers' `generate()` behind the guard (see the module docstring)."""

    parameters = _parameters(stock_generate)

    @functools.wraps(stock_generate)
    def generate_with_guard(self, *args, **kwargs):
        if _STOCK_CALL.get() or _argument(parameters, args, kwargs, "custom_generate") is not None:
            return stock_generate(self, *args, **kwargs)  # stock on our behalf, or the Hub route: untouched
        assistant_model = _argument(parameters, args, kwargs, "assistant_model")
        generation_config = _argument(parameters, args, kwargs, "generation_config")
        found = field_that_needs_hf_semspec(self, generation_config, assistant_model, kwargs)
        if found is not None:
            raise SemSpecConfigError(
                f"{type(self).__name__}.generate() got {found}, which only hf_semspec reads, but hf_semspec is not "
                "enabled for this model: transformers would decode without the rule. Fix: hf_semspec.attach(model) "
                "(this instance), or hf_semspec.enable() (every model in this process, pipelines included); or drop "
                "the field (acceptance=None turns a rule in a generation config off)."
            )
        if assistant_model is None:
            return stock_generate(self, *args, **kwargs)
        with _handing_to_transformers():  # its calls of the draft's generate() are transformers' own
            return stock_generate(self, *args, **kwargs)

    setattr(generate_with_guard, _MARK, "guard")
    return generate_with_guard


def install_guard() -> None:
    """Puts the guard in front of transformers' `generate()`, once per process (called by `import hf_semspec`)."""
    if getattr(compat.class_generate(), _MARK, None) is None:
        compat.set_class_generate(_guarded(compat.class_generate()))


def _enabled(replaced: Callable) -> Callable:
    parameters = _parameters(replaced)

    @functools.wraps(replaced)
    def generate_with_hf_semspec(self, *args, **kwargs):
        if _STOCK_CALL.get() or _argument(parameters, args, kwargs, "custom_generate") is not None:
            return replaced(self, *args, **kwargs)
        return generate(self, *args, **kwargs)

    generate_with_hf_semspec.__signature__ = inspect.signature(generate)
    setattr(generate_with_hf_semspec, _MARK, "enabled")
    return generate_with_hf_semspec


def enable() -> None:
    """Makes every transformers model of this process take hf_semspec's fields in `generate()` (`acceptance=`,
    `acceptance_kwargs=`, `draft_length=`, `draft_length_kwargs=`, or the same in a `GenerationConfig`), as
    `attach(model)` does for one instance: models loaded later and those a `pipeline("text-generation", model=path)`
    loads included. Calls without those fields run stock `generate()`, as with `attach`.

    In the spirit of liger-kernel's `apply_liger_kernel_to_*`: explicit and process-wide, and reversible with
    `disable()`. It replaces `GenerationMixin.generate` (a class whose own `generate` does not call it is not covered:
    attach its instances instead). Calling it again changes nothing.
    """
    if _replaced_by_enable:
        return
    current = compat.class_generate()
    _replaced_by_enable.append(current)
    compat.set_class_generate(_enabled(current))


def disable() -> None:
    """Undoes `enable()`: `GenerationMixin.generate` is again exactly what `enable()` replaced (attached models stay
    attached, and the guard stays). Calling it again, or without `enable()`, changes nothing."""
    if not _replaced_by_enable:
        return
    current = compat.class_generate()
    if getattr(current, _MARK, None) != "enabled":
        raise RuntimeError(
            f"GenerationMixin.generate was replaced after hf_semspec.enable() (it is now {current!r}); disable() "
            "would undo that too. Fix: undo that replacement first, then call hf_semspec.disable()."
        )
    compat.set_class_generate(_replaced_by_enable.pop())


def is_enabled() -> bool:
    """Whether `enable()` is in force."""
    return bool(_replaced_by_enable)
