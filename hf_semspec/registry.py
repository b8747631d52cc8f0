"""A name → class registry shared by acceptance rules and draft-length policies.

Each component module registers its class once, at import, with the registry's decorator. Names are lower-case
identifiers because they travel through `GenerationConfig` JSON and keyword arguments.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
from typing import Generic, TypeVar

from .component_config import ComponentConfig
from .errors import SemSpecConfigError, invalid_value

_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

T = TypeVar("T")


class Registry(Generic[T]):
    """Holds the registered classes of one kind (`kind`, e.g. "acceptance rule") under the argument `argument`."""

    def __init__(self, kind: str, argument: str, base: type, listing_function: str):
        self.kind = kind
        self.argument = argument
        self.base = base
        self.listing_function = listing_function
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: registers `cls` under `cls.name`; rejects duplicate and malformed names."""
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not _NAME_PATTERN.match(name):
            raise ValueError(
                f"Cannot register {cls.__qualname__} as a {self.kind}: its `name` = {name!r} must be a lower-case "
                f"identifier matching {_NAME_PATTERN.pattern}. Fix: set e.g. `name = \"my_rule\"` on the class."
            )
        if name in self._classes:
            raise ValueError(
                f"Cannot register {cls.__qualname__} as a {self.kind}: the name {name!r} is already taken by "
                f"{self._classes[name].__qualname__}. Fix: choose another `name`."
            )
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(f"Cannot register {cls!r} as a {self.kind}: it must subclass {self.base.__qualname__}.")
        config_class = getattr(cls, "config_class", None)
        if not (
            isinstance(config_class, type)
            and issubclass(config_class, ComponentConfig)
            and dataclasses.is_dataclass(config_class)
        ):
            raise ValueError(
                f"Cannot register {cls.__qualname__} as a {self.kind}: `config_class` = {config_class!r} must be a "
                "dataclass subclassing ComponentConfig (an empty one is fine)."
            )
        length_field = getattr(cls, "length_field", None)
        field_names = [f.name for f in dataclasses.fields(config_class)]
        if length_field is not None and length_field not in field_names:
            # generate() fills this field from num_assistant_tokens (and tapout its arms'): a wrong name fails there.
            raise ValueError(
                f"Cannot register {cls.__qualname__} as a {self.kind}: its `length_field` = {length_field!r} is not a "
                f"field of {config_class.__qualname__} ({field_names}). Fix: name the field that holds the length, or "
                "set `length_field = None`."
            )
        config_class.document_options()  # help(config_class) lists every option
        self._classes[name] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: object) -> type[T]:
        if not isinstance(name, str) or name not in self._classes:
            raise invalid_value(
                self.argument,
                name,
                f"one of {self.names()}",
                f"use a registered name ({self.listing_function}() lists them) or register your own {self.kind}",
            )
        return self._classes[name]

    def unregister(self, name: str) -> None:
        """Removes a registration (for tests and for replacing a component deliberately)."""
        if name not in self._classes:
            raise KeyError(f"No {self.kind} named {name!r} is registered.")
        del self._classes[name]

    def build(self, name: object, kwargs: dict | None) -> T:
        """Instantiates the component `name` with its validated config built from `kwargs`."""
        cls = self.get(name)
        return cls(cls.config_class.from_kwargs(kwargs))

    def __contains__(self, name: object) -> bool:
        return name in self._classes


def import_component_modules(package_name: str, package_path: list[str]) -> None:
    """Imports every public module of a component package (not `base`, not `_private` helpers), so that each
    registers itself."""
    for module in pkgutil.iter_modules(package_path):
        if module.name != "base" and not module.name.startswith("_"):
            importlib.import_module(f"{package_name}.{module.name}")


__all__ = ["Registry", "SemSpecConfigError", "import_component_modules"]
