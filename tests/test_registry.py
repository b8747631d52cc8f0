"""The rule registry and the config dataclass machinery shared by all rules."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch

import hf_semspec
from hf_semspec.component_config import Range
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, AcceptanceRule, RuleConfig, register_rule


@dataclass
class _ToyConfig(RuleConfig):
    component_name = "toy"
    threshold: float = field(default=0.5, metadata={"help": "a probability", "range": Range(0, 1)})
    window: int = field(default=3, metadata={"help": "positions", "range": Range(1, 8)})
    mode: str = field(default="a", metadata={"help": "variant", "choices": ("a", "b")})
    seed: int | None = field(default=None, metadata={"help": "optional seed"})


class _ToyRule(AcceptanceRule):
    name = "toy_rule"
    config_class = _ToyConfig

    def accept(self, inputs):
        return torch.ones_like(inputs.draft_token_ids, dtype=torch.bool)


@pytest.fixture
def toy_registered():
    register_rule(_ToyRule)
    yield _ToyRule
    RULES.unregister("toy_rule")


def test_available_rules_lists_registered_names(toy_registered):
    assert "exact" in hf_semspec.available_rules()
    assert "toy_rule" in hf_semspec.available_rules()
    assert hf_semspec.available_rules() == sorted(hf_semspec.available_rules())


def test_duplicate_name_is_rejected(toy_registered):
    class Again(_ToyRule):
        pass

    with pytest.raises(ValueError, match=r"name 'toy_rule' is already taken by _ToyRule"):
        register_rule(Again)


@pytest.mark.parametrize("bad_name", ["Toy", "toy-rule", "1toy", "", None, "toy rule"])
def test_malformed_name_is_rejected(bad_name):
    class Bad(_ToyRule):
        name = bad_name

    with pytest.raises(ValueError, match=r"must be a lower-case identifier"):
        register_rule(Bad)
    assert bad_name not in RULES


def test_rule_without_dataclass_config_is_rejected():
    class NoConfig(_ToyRule):
        name = "no_config"
        config_class = dict

    with pytest.raises(ValueError, match=r"`config_class` = .*must be a dataclass subclassing ComponentConfig"):
        register_rule(NoConfig)


def test_non_rule_class_is_rejected():
    class NotARule:
        name = "not_a_rule"
        config_class = _ToyConfig

    with pytest.raises(ValueError, match=r"must subclass AcceptanceRule"):
        register_rule(NotARule)


def test_config_defaults_and_json_roundtrip():
    config = _ToyConfig.from_kwargs({"threshold": 1, "mode": "b"})
    assert config.threshold == 1 and config.window == 3 and config.mode == "b"
    assert _ToyConfig.from_kwargs(json.loads(json.dumps(config.to_dict()))) == config
    # to_dict() holds the options given (as a GenerationConfig saves them); all_options() every one
    assert config.to_dict() == {"threshold": 1.0, "mode": "b"}
    assert config.all_options() == {"threshold": 1.0, "window": 3, "mode": "b", "seed": None}


def test_an_int_given_for_a_float_is_stored_as_a_float():
    # 1 and 1.0 compared equal but made different keys (a tapout arm given twice, a kept policy not found again).
    config = _ToyConfig.from_kwargs({"threshold": 1})
    assert type(config.threshold) is float
    assert repr(config.all_options()) == repr(_ToyConfig(threshold=1.0).all_options())
    assert type(_ToyConfig(seed=3).seed) is int  # int fields stay ints


def test_unknown_options_of_any_key_type_get_the_config_error():
    with pytest.raises(SemSpecConfigError, match=r"unknown option\(s\) \['windw', 1\] for 'toy'"):
        _ToyConfig.from_kwargs({1: 2, "windw": 3, "window": 2})


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"threshold": 1.5}, r"`acceptance_kwargs\['threshold'\]` = 1.5.*values in \[0, 1\].*default is 0.5"),
        ({"window": 0}, r"`acceptance_kwargs\['window'\]` = 0.*values in \[1, 8\]"),
        ({"window": 2.0}, r"`acceptance_kwargs\['window'\]` = 2.0.*type int"),
        ({"window": True}, r"`acceptance_kwargs\['window'\]` = True.*type int"),
        ({"mode": "c"}, r"`acceptance_kwargs\['mode'\]` = 'c'.*one of \['a', 'b'\]"),
        ({"threshold": "high"}, r"type float"),
        ({"seed": 1.5}, r"`acceptance_kwargs\['seed'\]` = 1.5.*int or None"),
        ({"windw": 3}, r"unknown option\(s\) \['windw'\] for 'toy'.*allowed \['threshold', 'window', 'mode', 'seed'\]"),
    ],
)
def test_config_validation_names_field_value_and_fix(kwargs, pattern):
    with pytest.raises(SemSpecConfigError, match=pattern):
        _ToyConfig.from_kwargs(kwargs)


def test_range_bounds():
    half_open = Range(0, 1, high_inclusive=False)
    assert 0 in half_open and 0.999 in half_open and 1 not in half_open
    assert str(half_open) == "[0, 1)" and str(Range(low=1)) == "[1, inf]"


def test_field_docs_describe_every_option():
    docs = {row["name"]: row for row in _ToyConfig.field_docs()}
    assert docs["threshold"]["allowed"] == "[0, 1]" and docs["threshold"]["default"] == 0.5
    assert docs["mode"]["allowed"] == ["a", "b"] and docs["seed"]["type"] == "int or None"


@dataclass
class _ListOptionConfig(RuleConfig):
    component_name = "toy_with_a_list"
    ids: list = field(default_factory=lambda: [1, 2], metadata={"help": "token ids"})


def test_a_default_factory_is_shown_as_its_value():
    # field.default is the MISSING sentinel for such a field: docs and errors must show the factory's value.
    assert _ListOptionConfig.field_docs()[0]["default"] == [1, 2]
    with pytest.raises(SemSpecConfigError, match=r"Fix: pass e.g. acceptance_kwargs=\{'ids': \[1, 2\]\} \(the default\)"):
        _ListOptionConfig.from_kwargs({"ids": "x"})


def _components():
    from hf_semspec.draft_length import POLICIES

    return [RULES.get(name) for name in RULES.names()] + [POLICIES.get(name) for name in POLICIES.names()]


@pytest.mark.parametrize("component", _components(), ids=lambda c: f"{c.config_class.argument_name}:{c.name}")
def test_help_of_every_registered_config_shows_each_option(component):
    import pydoc
    import re

    config_class = component.config_class
    shown = pydoc.render_doc(config_class, renderer=pydoc.plaintext)
    args = shown.split("Args:", 1)[1] if "Args:" in shown else ""
    for row in config_class.field_docs():
        assert row["help"], f"{config_class.__name__}.{row['name']} has no metadata help"
        assert re.search(rf"\n \|\s+{row['name']} \(`", args), f"help({config_class.__name__}) does not show {row['name']}"


def test_a_registered_config_without_args_gets_them_from_the_metadata(toy_registered):
    assert "Args:\n    threshold (`float`, defaults to 0.5): a probability; allowed [0, 1].\n" in _ToyConfig.__doc__
    assert "    mode (`str`, defaults to 'a'): variant; allowed ['a', 'b'].\n" in _ToyConfig.__doc__
