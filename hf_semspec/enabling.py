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
import threading
from typing import Any, Callable, Iterator

from . import _transformers_compat as compat
from .errors import SemSpecConfigError
from .generation import _STOCK_CALL, _handing_to_transformers, field_that_needs_hf_semspec, generate

_MARK = "__hf_semspec__"  # on the functions this module installs: "guard" or "enabled"
_REPLACED = "__hf_semspec_replaced__"  # on `enable()`'s function: the one it replaced, which `disable()` puts back

# The state of `enable()` / `disable()` is what `GenerationMixin.generate` holds (`_enabled_layer`), not a variable of
# this module, which `importlib.reload` would reset. The lock that makes each check-then-act below atomic must outlive
# a reload too, or a thread running the functions from before a reload and one running those from after it would take
# different locks: a reload runs this file again in the same module namespace, so the first run creates the lock and
# every later run keeps it.
_LOCK: threading.Lock = globals().get("_LOCK") or threading.Lock()


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
    with _LOCK:
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
    setattr(generate_with_hf_semspec, _REPLACED, replaced)
    return generate_with_hf_semspec


def _layers() -> Iterator[Callable]:
    """`GenerationMixin.generate`, then each function that the one before records as the one it wraps (`__wrapped__`,
    set by `functools.wraps`), as far as that goes."""
    function, seen = compat.class_generate(), set()
    while function is not None and id(function) not in seen:
        seen.add(id(function))
        yield function
        function = getattr(function, "__wrapped__", None)


def _is_enabled_layer(function: Callable) -> bool:
    """Whether `function` is one that `enable()` installed. `functools.wraps` copies a function's attributes, marks
    included, onto the wrapper: one of ours is the one whose `__wrapped__` is still the function it replaced."""
    replaced = getattr(function, _REPLACED, None)
    if getattr(function, _MARK, None) != "enabled" or replaced is None:
        return False
    return getattr(function, "__wrapped__", None) is replaced


def _enabled_layer() -> tuple[Callable | None, bool]:
    """The function `enable()` installed, if `GenerationMixin.generate` is it or leads to it (`_layers`), and whether it
    is `GenerationMixin.generate` itself; `(None, False)` where none is found."""
    for depth, function in enumerate(_layers()):
        if _is_enabled_layer(function):
            return function, depth == 0
    return None, False


def enable() -> None:
    """Makes every transformers model of this process take hf_semspec's fields in `generate()` (`acceptance=`,
    `acceptance_kwargs=`, `draft_length=`, `draft_length_kwargs=`, or the same in a `GenerationConfig`), as
    `attach(model)` does for one instance: models loaded later and those a `pipeline("text-generation", model=path)`
    loads included. Calls without those fields run stock `generate()`, as with `attach`.

    In the spirit of liger-kernel's `apply_liger_kernel_to_*`: explicit and process-wide, and reversible with
    `disable()`. It replaces `GenerationMixin.generate` (a class whose own `generate` does not call it is not covered:
    attach its instances instead). Calling it again changes nothing.
    """
    with _LOCK:
        if _enabled_layer()[0] is not None:
            return
        compat.set_class_generate(_enabled(compat.class_generate()))


def disable() -> None:
    """Undoes `enable()`: `GenerationMixin.generate` is again exactly what `enable()` replaced (attached models stay
    attached, and the guard stays). Calling it again, or without `enable()`, changes nothing. Where something replaced
    `GenerationMixin.generate` after `enable()` (or after `import hf_semspec`, leaving no `__wrapped__` to follow), it
    raises rather than undo that replacement too or leave `enable()` silently in force behind it."""
    with _LOCK:
        layer, in_front = _enabled_layer()
        if in_front:
            compat.set_class_generate(getattr(layer, _REPLACED))
            return
        current = compat.class_generate()
        if layer is not None:
            raise RuntimeError(
                f"GenerationMixin.generate was replaced after hf_semspec.enable() (it is now {current!r}); disable() "
                "would undo that too. Fix: undo that replacement first, then call hf_semspec.disable()."
            )
        if getattr(current, _MARK, None) is None:
            # Not the guard that `import hf_semspec` installed, nor a function leading to it: something replaced it
            # without recording what it replaced, and whether `enable()`'s function sits behind cannot be told.
            raise RuntimeError(
                f"GenerationMixin.generate was replaced after hf_semspec was imported (it is now {current!r}), hiding "
                "what hf_semspec installed: disable() cannot tell whether hf_semspec.enable() is in force behind it. "
                "Fix: undo that replacement first, then call hf_semspec.disable()."
            )


def is_enabled() -> bool:
    """Whether `enable()` is in force: `GenerationMixin.generate` is the function it installed, or leads to it through
    `__wrapped__` (as a later replacement made with `functools.wraps` does)."""
    return _enabled_layer()[0] is not None
