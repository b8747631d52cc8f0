"""Dataclass configs for pluggable components (acceptance rules, draft-length policies).

Every option is a dataclass field whose `metadata` carries a `help` string and, where it applies, a `Range` or a
tuple of `choices`. `ComponentConfig.validate()` checks types, ranges and choices from that metadata, so a component
only writes code for the checks that involve several fields at once (`_validate_extra`). Configs are plain JSON
values, which is what lets them live inside a `GenerationConfig` saved to JSON.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import SemSpecConfigError, invalid_value


@dataclass(frozen=True)
class Range:
    """A numeric interval used in field metadata, e.g. `Range(0, 1, high_inclusive=False)` is ``[0, 1)``."""

    low: float = -math.inf
    high: float = math.inf
    low_inclusive: bool = True
    high_inclusive: bool = True

    def __contains__(self, value: float) -> bool:
        above = value >= self.low if self.low_inclusive else value > self.low
        below = value <= self.high if self.high_inclusive else value < self.high
        return above and below

    def __str__(self) -> str:
        left = "[" if self.low_inclusive else "("
        right = "]" if self.high_inclusive else ")"
        return f"{left}{_fmt(self.low)}, {_fmt(self.high)}{right}"


POSITIVE = Range(0, math.inf, low_inclusive=False, high_inclusive=False)
"""(0, inf): a strictly positive number."""


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return str(int(x)) if float(x).is_integer() else str(x)


_UNION_TYPES = (typing.Union, types.UnionType)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default: `default`, or a fresh `default_factory()` (the way a dataclass gives a list or dict
    default), or None for a field without one (`field.default` is then the `MISSING` sentinel, not a value)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in _UNION_TYPES:
        return " or ".join(_describe_type(a) for a in typing.get_args(tp))
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _takes_float_not_int(tp: Any) -> bool:
    """A field typed `float` (or `float | None`) without `int`: an int given there is stored as a float."""
    options = typing.get_args(tp) if typing.get_origin(tp) in _UNION_TYPES else (tp,)
    return float in options and int not in options


def python_number(value: Any) -> Any:
    """numpy's (and other libraries') numbers and bools as Python's own: `np.int64(3)` is the int 3, which a config's
    JSON can hold, its type check accepts and a key compares equal by repr (`np.float64(0.5)`, a float subclass, is
    converted too); anything else unchanged."""
    if type(value) in (bool, int, float):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    return value


def _matches_type(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in _UNION_TYPES:
        return any(_matches_type(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:  # JSON has one number type: accept ints where floats are expected, never bools
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, tp)


@dataclass
class ComponentConfig:
    """Base of every rule and policy config.

    Subclasses are dataclasses whose fields carry `metadata={"help": ..., "range": Range(...)}` or
    `metadata={"help": ..., "choices": (...)}`.
    """

    # Set by subclasses: used in error messages, e.g. "acceptance_kwargs" and the component's name.
    argument_name: ClassVar[str] = "kwargs"
    component_name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def field_docs(cls) -> list[dict[str, Any]]:
        """One dict per option: `name`, `type`, `default`, `range` (or `choices`) and `help` — for docs and cards."""
        hints = typing.get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            if f.name.startswith("_"):  # internal state, not an option (RuleConfig's `_memo`)
                continue
            allowed = f.metadata.get("range") or f.metadata.get("choices")
            rows.append(
                {
                    "name": f.name,
                    "type": _describe_type(hints[f.name]),
                    "default": default_of(f),
                    "allowed": str(allowed) if isinstance(allowed, Range) else (list(allowed) if allowed else None),
                    "help": f.metadata.get("help", ""),
                }
            )
        return rows

    @classmethod
    def document_options(cls) -> None:
        """Gives the class docstring an "Args:" section built from the fields' metadata, so that `help(cls)` shows
        every option, where the class does not write one itself (called when its component registers). A hand-written
        section is kept: tests/test_registry.py checks that it names every field."""
        own = cls.__dict__.get("__doc__") or ""
        if "Args:" in own:
            return
        if not own or own.startswith(f"{cls.__name__}("):  # no docstring: the signature dataclass puts there
            own = f"Options of `{cls.component_name}` (`{cls.argument_name}`)."
        entries = []
        for row in cls.field_docs():
            allowed = f"; allowed {row['allowed']}" if row["allowed"] is not None else ""
            entry = f"{row['name']} (`{row['type']}`, defaults to {row['default']!r}): {row['help']}{allowed}."
            entries.append(textwrap.fill(entry, 112, initial_indent=" " * 4, subsequent_indent=" " * 8))
        cls.__doc__ = own.rstrip() + ("\n\nArgs:\n" + "\n".join(entries) + "\n" if entries else "")

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any] | None) -> "ComponentConfig":
        """Builds and validates a config from user kwargs (`None` means all defaults), or validates a copy of a
        config instance: the caller's object is never changed (`generate()` fills the length into its config)."""
        if kwargs is None:
            kwargs = {}
        if isinstance(kwargs, cls):
            config = copy.deepcopy(kwargs)
            config.validate()
            return config
        if not isinstance(kwargs, dict):
            raise invalid_value(
                cls.argument_name,
                kwargs,
                f"a dict of options of '{cls.component_name}'",
                f"pass e.g. {cls.argument_name}={{}} or a {cls.__name__}",
            )
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names), key=repr)  # keys of any type, e.g. a number, are named too
        if unknown:
            raise SemSpecConfigError(
                f"`{cls.argument_name}` has unknown option(s) {unknown} for '{cls.component_name}': "
                f"allowed {names or 'no options'}. Fix: remove or rename them."
            )
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The options that differ from their defaults: what `from_kwargs` needs to build this config again, and what
        a `GenerationConfig` holding the instance saves to JSON (transformers serializes it with `to_dict()`), so the
        saved options read back as the instance's own: a field left at its default is not given (`generate()` then
        fills a length field from `num_assistant_tokens`), and the defaults of the version that loads it apply."""
        return {
            f.name: copy.deepcopy(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != default_of(f)
        }

    def all_options(self) -> dict[str, Any]:
        """Every option with its value, defaults included (for records that must not change meaning when a default
        does, and for keys)."""
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Checks every field against its type, range and choices; raises `SemSpecConfigError` naming the fix."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = python_number(getattr(self, f.name))
            setattr(self, f.name, value)
            field_label = f"{self.argument_name}['{f.name}']"
            if not _matches_type(value, hints[f.name]):
                raise invalid_value(
                    field_label,
                    value,
                    f"a value of type {_describe_type(hints[f.name])} ({f.metadata.get('help', '')})",
                    f"pass e.g. {self.argument_name}={{'{f.name}': {default_of(f)!r}}} (the default)",
                )
            allowed_range = f.metadata.get("range")
            if allowed_range is not None and value is not None and value not in allowed_range:
                raise invalid_value(
                    field_label,
                    value,
                    f"values in {allowed_range} for '{self.component_name}'",
                    f"choose a value in {allowed_range}; the default is {default_of(f)!r}",
                )
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise invalid_value(
                    field_label,
                    value,
                    f"one of {list(choices)} for '{self.component_name}'",
                    f"pass one of {list(choices)}; the default is {default_of(f)!r}",
                )
            if isinstance(value, int) and not isinstance(value, bool) and _takes_float_not_int(hints[f.name]):
                # 1 and 1.0 are one option: stored alike, they make one key for a kept policy or a tapout arm (an
                # error above names the value as it was given).
                setattr(self, f.name, float(value))
        self._validate_extra()

    def _validate_extra(self) -> None:
        """Checks that involve several fields; subclasses override."""
