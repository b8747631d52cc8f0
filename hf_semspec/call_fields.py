"""Where a `generate()` call's fields come from, resolved once (`CallFields`).

A call reads each field from three places, most specific first: its keyword arguments, a passed `GenerationConfig`,
and the model's `generation_config`. transformers merges them once (`GenerationMixin._prepare_generation_config`) and
reads the merged config afterwards; `generate()` here builds one `CallFields` per call, hf_semspec's own fields
(`acceptance`, `draft_length`, `drafting` and their options) included, and reads every `GenerationConfig` field
through it (the call's other arguments, `tokenizer`, `position_ids` and the like, are no config's fields, and the
draft model's own settings are the draft's). Three ways of reading a field, each the rule docs/usage.md states for
the fields that use it:

- `merged(name)`: as transformers' `generate()` merges it: the call's (an explicit None included), else a passed
  config's where not None, else the model's (prompt lookup, the ensemble weight, stop strings, `drafting`,
  `do_sample`);
- `chosen(name)`: the most specific value set: the call's, else a passed config's that the caller set (`passed`:
  not a copy of the model's own), else the model's default (the draft length, transformers' assisted-generation
  switches, which stock transformers reads from the draft's config, and `token_healing`);
- `component(name, kwargs)`: a name and its options, which travel together (a rule's options never reach another
  rule).

`given(...)` says whether a field was set for this call at all (for the errors that refuse a field nothing reads).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from transformers import GenerationConfig

from ._transformers_compat import transformers_default
from .errors import invalid_value

# The places a field is read from, most to least specific.
CALL, PASSED_CONFIG, MODEL = 0, 1, 2
PLACE_NAMES = ("call", "generation_config", "model")


class CallFields:
    """One call's fields, as the call, a passed `GenerationConfig` and the model's generation config give them.

    Args:
        model_config (`GenerationConfig`): the model's `generation_config`.
        passed_config (`GenerationConfig`, *optional*): the `generation_config` passed to `generate()`.
        call (`Mapping[str, Any]`): the fields the call passed as keyword arguments, an explicit None included (a
            field left out is not given; `generate()` leaves out its own arguments left at their defaults).
    """

    def __init__(self, model_config: GenerationConfig, passed_config: GenerationConfig | None,
                 call: Mapping[str, Any]):
        self.model_config = model_config
        self.passed_config = passed_config
        self._call = dict(call)

    def in_call(self, name: str) -> bool:
        return name in self._call

    def call(self, name: str) -> Any:
        """The call's value (None where not given)."""
        return self._call.get(name)

    def model(self, name: str) -> Any:
        return getattr(self.model_config, name, None)

    def passed(self, name: str) -> Any:
        """A passed config's value where the caller set it: None when unset or equal to the model's own (a passed
        `model.generation_config`, or a copy of it, as evaluation harnesses pass it, asks for nothing), or, in a
        config transformers already prepared (as its pipelines before 5.24 pass it), equal to transformers' own
        default where the model sets none: what `generate()` would use anyway."""
        value = getattr(self.passed_config, name, None)
        own = self.model(name)
        if value == own or (own is None and value is not None
                            and value == transformers_default(self.passed_config, name)):
            return None
        return value

    @staticmethod
    def field_name(name: str, place: int) -> str:
        """The field as the user wrote it, for the errors: `name`, `generation_config.name` or
        `model.generation_config.name`."""
        return (name, f"generation_config.{name}", f"model.generation_config.{name}")[place]

    def merged(self, name: str) -> tuple[Any, str]:
        """`(value, field)` as transformers' `generate()` merges field `name`: the call's (an explicit None
        included), else a passed config's where not None, else the model's; `field` names where it came from."""
        if name in self._call:
            return self._call[name], name
        value = getattr(self.passed_config, name, None)
        if value is not None:
            return value, self.field_name(name, PASSED_CONFIG)
        return self.model(name), self.field_name(name, MODEL)

    def chosen(self, name: str, places: tuple[int, ...] = (CALL, PASSED_CONFIG, MODEL)) -> tuple[Any, int | None]:
        """`(value, place)`: the first value set among `places`, in order: the call's (not None), a passed config's
        that the caller set (`passed`), the model's; `(None, None)` where none is."""
        for place in places:
            value = (self.call, self.passed, self.model)[place](name)
            if value is not None:
                return value, place
        return None, None

    def given(self, *names: str) -> tuple[str, Any] | None:
        """`(field, value)` of the first of `names` set for this call: in the call (not None), then in a passed
        config (`passed`); the model's own are defaults, not given. None where none is."""
        for place in (CALL, PASSED_CONFIG):
            for name in names:
                value = self.call(name) if place == CALL else self.passed(name)
                if value is not None:
                    return self.field_name(name, place), value
        return None

    def place_of(self, name: str, value: Any) -> int:
        """Where the object `value` (what `component` returned for field `name`) came from: the call's, a passed
        config's that the caller set, else the model's."""
        if value is not None and value is self.call(name):
            return CALL
        passed = self.passed(name)
        return PASSED_CONFIG if passed is not None and value is passed else MODEL

    def component(self, name_field: str, kwargs_field: str, *, listing_function: str,
                  model_orphans_are_errors: bool = False) -> tuple[Any, Any, str | None]:
        """`(name, options, source)` of one component (a rule, a draft-length policy). The name: the first set of
        the call's, the passed config's, the model's. The options, as transformers merges a call into a passed
        config and that into the model's, field by field: the first set, in the same order, of those given for that
        name, i.e. with no name beside them or the same one. So a component's options never reach another one, and
        options given without a name anywhere (in the call or a passed config) are an error rather than dropped;
        the model's own too with `model_orphans_are_errors` (the draft length, read only when a rule decodes; a
        model's orphan rule options leave stock decoding stock). A passed config with the model's own name and
        options is the model's default (source "model"). `listing_function` names the function that lists the
        names, for the error."""
        sources = [("call", self.call(name_field), self.call(kwargs_field))] + [
            (source, getattr(config, name_field, None), getattr(config, kwargs_field, None))
            for source, config in (("generation_config", self.passed_config), ("model", self.model_config))
        ]
        if sources[1][1] is not None and sources[1][1:] == sources[2][1:]:
            # A passed config that carries the model's own default (`generation_config=model.generation_config`, or
            # a copy, as evaluation harnesses pass it) asks for nothing the model's default does not: read it so.
            sources[1] = ("model",) + sources[1][1:]
        named = next(((source, name) for source, name, _ in sources if name is not None), None)
        if named is None:
            checked = sources if model_orphans_are_errors else sources[:2]
            orphan = next(((source, options) for source, _, options in checked if options is not None), None)
            if orphan is not None:
                source, options = orphan
                raise invalid_value(
                    self.field_name(kwargs_field, PLACE_NAMES.index(source)),
                    options,
                    f"only together with `{name_field}`",
                    f"also set {name_field}=... ({listing_function}() lists the names)",
                )
            return None, None, None
        source, name = named
        options = next((options for _, own, options in sources if options is not None and own in (None, name)), None)
        return name, options, source

    def for_transformers(self, name: str, kwargs: dict, generation_config: GenerationConfig | None
                         ) -> GenerationConfig | None:
        """Makes transformers' `generate()` see field `name` as None (a setting the loop has read already), and
        returns the generation config to pass it; `kwargs` and `generation_config` are what the call hands
        transformers. A value only in a passed config is cleared in a copy of it (transformers reads a None there as
        unset); one in the call or the model's config is overridden by the call's None (the model's would fill a
        passed config's None back in; with a passed config, transformers then warns that a config and an argument
        were both given)."""
        if name in kwargs or self.model(name) is not None:
            kwargs[name] = None
        elif getattr(generation_config, name, None) is not None:
            generation_config = copy.deepcopy(generation_config)
            setattr(generation_config, name, None)
        return generation_config
