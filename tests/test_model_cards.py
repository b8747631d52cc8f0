"""Model cards (`hf_semspec.drafters.cards`, templates in `model_cards/`): the `custom_generate` repo card lists
every registered rule and policy with every option; a pruned drafter's card carries its metadata and license."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field

import pytest
import torch
from conftest import perturbed_copy
from huggingface_hub import ModelCard
from test_drafters import make_tokenizer
from transformers import AutoModelForCausalLM

from hf_semspec.component_config import Range
from hf_semspec.draft_length import POLICIES
from hf_semspec.drafters import custom_generate_card, prune_vocabulary, render_custom_generate_card
from hf_semspec.drafters.cards import (
    DEFAULT_LICENSE,
    TEMPLATE_DIR_ENV,
    parse_and_check_card,
    pruned_drafter_card,
    template_dir,
)
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, RuleConfig
from hf_semspec.rules.exact import ExactRule


def _option_row(option: dict) -> str:
    allowed = option["allowed"] if option["allowed"] is not None else "any"
    help_text = " ".join(option["help"].split())
    return f"| `{option['name']}` | {option['type']} | `{option['default']!r}` | {allowed} | {help_text} |"


def test_custom_generate_card_lists_every_rule_and_policy_with_every_option():
    text = render_custom_generate_card()
    card = ModelCard(text)
    assert "custom_generate" in card.data.to_dict()["tags"]
    assert RULES.names() and POLICIES.names()
    for registry, argument in ((RULES, "acceptance"), (POLICIES, "draft_length")):
        for name in registry.names():
            component = registry.get(name)
            section = text.split(f'#### `{argument}="{name}"`', 1)
            assert len(section) == 2, f"{argument}={name} has no section"
            body = section[1].split("#### ", 1)[0]
            options = component.config_class.field_docs()
            for option in options:
                assert _option_row(option) in body.replace("\\|", "|"), f"{name}.{option['name']} missing"
            if not options:
                assert "No options." in body
            if component.paper:
                assert component.paper in text.split("## Citations", 1)[1]
    for name in RULES.names():
        assert f"| `{name}` | {'yes' if RULES.get(name).lossless else 'no'} |" in text


def test_a_newly_registered_rule_appears_in_the_card():
    @dataclass
    class ToyConfig(RuleConfig):
        component_name = "toy_card_rule"
        slack: float = field(default=0.25, metadata={"help": "how much to forgive", "range": Range(0, 1)})

    class ToyRule(ExactRule):
        name = "toy_card_rule"
        config_class = ToyConfig
        paper = "https://example.org/toy-paper"
        lossless = False

    RULES.register(ToyRule)
    try:
        text = render_custom_generate_card()
    finally:
        RULES.unregister("toy_card_rule")
    assert '#### `acceptance="toy_card_rule"`' in text
    assert "| `slack` | float | `0.25` | [0, 1] | how much to forgive |" in text
    assert "https://example.org/toy-paper" in text and "`toy_card_rule`" in text.split("Lossless rules")[1].split("##")[0]
    assert "toy_card_rule" not in render_custom_generate_card()


def test_card_check_rejects_missing_metadata():
    with pytest.raises(SemSpecConfigError, match=r"metadata lacks \['library_name', 'license', 'tags'\]"):
        parse_and_check_card("# no metadata\n")
    assert custom_generate_card().data.to_dict()["license"] == "apache-2.0"


def test_pruned_drafter_card_default_license_when_unknown(target):
    drafter = prune_vocabulary(perturbed_copy(target, 0.3, 2), make_tokenizer(), ["dog cat"], keep=20)
    card = drafter.model_card()
    metadata = card.data.to_dict()
    assert metadata["license"] == DEFAULT_LICENSE and "base_model" not in metadata
    assert "could not be determined" in card.text and "20 (15.6%)" in card.text
    given = drafter.model_card(license="mit")
    assert given.data.to_dict()["license"] == "mit" and "the license of the base model" not in given.text
    assert "whose license could not be determined when this drafter was made" in given.text


def test_license_and_base_model_inherited_from_the_base_models_folder(tmp_path, target):
    folder = tmp_path / "base"
    perturbed_copy(target, 0.3, 2).save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# base\n", encoding="utf-8")
    (folder / "hf_semspec_manifest.json").write_text(json.dumps({"upstream": "Org/Tiny-Base"}), encoding="utf-8")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    drafter = prune_vocabulary(model, make_tokenizer(), ["dog cat"], keep=20)
    assert drafter.pruning_info["license"] == "apache-2.0" and drafter.pruning_info["base_model"] == "Org/Tiny-Base"
    metadata = drafter.model_card(repo_id="me/tiny").data.to_dict()
    assert metadata["license"] == "apache-2.0" and metadata["base_model"] == "Org/Tiny-Base"
    assert drafter.model_card(license="mit").data.to_dict()["license"] == "mit"  # an explicit license wins
    assert "`apache-2.0`, the license of the base model, applies" in drafter.model_card().text
    assert "`apache-2.0`, the license of the base model" in drafter.model_card(license="apache-2.0").text


def test_templates_location(monkeypatch, tmp_path):
    shipped = template_dir()
    assert (shipped / "pruned_drafter.md").is_file()
    monkeypatch.setenv(TEMPLATE_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"templates \['pruned_drafter.md', 'custom_generate.md'\] are not in .*Fix: "):
        render_custom_generate_card()
    # A folder of one's own templates: each must be there, and each $ a placeholder the renderer fills, or $$.
    shutil.copy(shipped / "pruned_drafter.md", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"templates \['custom_generate.md'\] are not in "):
        render_custom_generate_card()
    original = (shipped / "custom_generate.md").read_text(encoding="utf-8")
    for added, message in (("Hosting costs $5 a month.", r"custom_generate.md: Invalid placeholder .*Fix: write \$\$"),
                           ("See $homepage.", r"has the placeholder \$homepage, which is not one of \[.*'version'\]")):
        (tmp_path / "custom_generate.md").write_text(original + added, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            render_custom_generate_card()
    (tmp_path / "custom_generate.md").write_text(original + "Hosting costs $$5 a month.", encoding="utf-8")
    assert render_custom_generate_card().endswith("Hosting costs $5 a month.")


def test_a_base_licence_other_keeps_its_name_and_link(tmp_path, target):
    # A license "other" names its terms in license_name / license_link (as Qwen's research license does).
    folder = tmp_path / "base"
    perturbed_copy(target, 0.3, 2).save_pretrained(folder)
    link = "https://example.org/LICENSE"
    (folder / "README.md").write_text(f"---\nlicense: other\nlicense_name: tiny-research\nlicense_link: {link}\n---\n",
                                      encoding="utf-8")
    drafter = prune_vocabulary(AutoModelForCausalLM.from_pretrained(folder), make_tokenizer(), ["dog cat"], keep=20)
    card = drafter.model_card(repo_id="me/tiny")
    metadata = card.data.to_dict()
    assert (metadata["license"], metadata["license_name"], metadata["license_link"]) == ("other", "tiny-research", link)
    assert f"`other` (`tiny-research`, {link})" in card.text
    other = drafter.model_card(license="mit")
    assert "license_name" not in other.data.to_dict()  # not another license's terms
    # Another license is the uploader's: the card does not call it the base model's, and names the base's.
    assert "the license of the base model" not in other.text
    assert "The uploader set the license `mit` for these weights" in other.text
    assert f"whose license was recorded as `other` (`tiny-research`, {link}) when this drafter was made" in other.text


def test_a_template_saved_with_a_byte_order_mark(monkeypatch, tmp_path):
    shipped = template_dir()
    for name in ("pruned_drafter.md", "custom_generate.md"):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + (shipped / name).read_bytes())  # as Windows editors save
    monkeypatch.setenv(TEMPLATE_DIR_ENV, str(tmp_path))
    assert render_custom_generate_card().startswith("---\n")
    info = {"vocab_size": 64, "keep_size": 16, "base_model": "Org/Tiny", "license": "mit", "selection": {}, "rdk": None}
    assert pruned_drafter_card(info, repo_id="me/tiny").data.to_dict()["license"] == "mit"
