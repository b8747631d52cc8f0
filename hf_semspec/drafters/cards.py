"""Model cards: the README of a pruned drafter's Hub repo and of an hf_semspec `custom_generate` repo.

The prose lives in templates in the repository's `model_cards/` folder (`string.Template` syntax, `$name`); the
facts (pruning numbers, the registered rules and draft-length policies with every option) are rendered here, and
the YAML metadata is written with `huggingface_hub.ModelCardData`. Every card is parsed back with
`huggingface_hub.ModelCard` and its required metadata checked before it is returned (no network: `ModelCard.validate`
would ask the Hub).

Templates are looked up in `$HF_SEMSPEC_MODEL_CARDS` if set, else in the installed package data
`hf_semspec.model_cards` (the repository's `model_cards/` folder, shipped in the wheel by setup.cfg).
"""

from __future__ import annotations

import os
import pathlib
import string
import sys
from importlib import resources
from typing import Any

from ..errors import SemSpecConfigError

TEMPLATE_DIR_ENV = "HF_SEMSPEC_MODEL_CARDS"
PRUNED_DRAFTER_TEMPLATE = "pruned_drafter.md"
CUSTOM_GENERATE_TEMPLATE = "custom_generate.md"
DEFAULT_LICENSE = "other"
"""Used when the base model's license is unknown; the card then says that the base model's license applies."""
REQUIRED_METADATA = ("library_name", "license", "tags")
RDK_PAPER = "https://arxiv.org/abs/2506.03206"


def template_dir() -> pathlib.Path:
    """The folder holding the card templates (see the module docstring)."""
    override = os.environ.get(TEMPLATE_DIR_ENV)
    # The repository's model_cards/ folder is installed as the package data `hf_semspec.model_cards` (setup.cfg).
    folder = pathlib.Path(override) if override else pathlib.Path(str(resources.files("hf_semspec.model_cards")))
    missing = [name for name in (PRUNED_DRAFTER_TEMPLATE, CUSTOM_GENERATE_TEMPLATE) if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"hf_semspec's model-card templates {missing} are not in {folder}. Fix: reinstall hf_semspec (the "
            f"templates ship in the package), or set ${TEMPLATE_DIR_ENV} to a folder holding {PRUNED_DRAFTER_TEMPLATE} "
            f"and {CUSTOM_GENERATE_TEMPLATE}."
        )
    return folder


def _render(template_name: str, values: dict[str, Any]) -> str:
    path = template_dir() / template_name
    try:
        return string.Template(path.read_text(encoding="utf-8-sig")).substitute({k: str(v) for k, v in values.items()})
    except KeyError as err:  # a $name the renderer does not fill
        raise ValueError(
            f"The model-card template {path} has the placeholder ${err.args[0]}, which is not one of "
            f"{sorted(values)}. Fix: use one of those, or write $$ for a literal $."
        ) from err
    except ValueError as err:  # a $ followed by neither a name nor $, e.g. "$5"
        raise ValueError(f"The model-card template {path}: {err}. Fix: write $$ for a literal $.") from err


def parse_and_check_card(text: str, required: tuple[str, ...] = REQUIRED_METADATA):
    """Parses `text` with `huggingface_hub.ModelCard` and checks that its YAML metadata has the `required` fields;
    returns the `ModelCard`."""
    from huggingface_hub import ModelCard

    card = ModelCard(text)
    metadata = card.data.to_dict()
    missing = [name for name in required if not metadata.get(name)]
    if missing:
        raise SemSpecConfigError(
            f"the model card's metadata lacks {missing} (has {sorted(metadata)}). Fix: the card template in "
            f"{template_dir()} must keep its `$card_data` block."
        )
    return card


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Pruned drafter
# ---------------------------------------------------------------------------------------------------------------------


def _describe_selection(selection: dict) -> list[tuple[str, str]]:
    rows = [("selection method", selection.get("method", "unknown"))]
    requested = selection.get("requested")
    if requested:
        rows.append(("requested", ", ".join(f"{k}={v}" for k, v in requested.items())))
    corpus = selection.get("corpus")
    if corpus:
        rows.append(
            (
                "corpus",
                f"{corpus['source']}: {corpus['num_texts']:,} texts, {corpus['num_tokens']:,} tokens, "
                f"{corpus['distinct_tokens']:,} distinct",
            )
        )
    calibration = selection.get("calibration")
    if calibration:
        who = "the drafter's own" if calibration.get("is_drafter") else f"`{calibration['model']}`'s"
        rows.append(
            (
                "calibration",
                f"{who} greedy generations on {calibration['num_prompts']} prompts (≤ {calibration['max_new_tokens']} "
                f"new tokens each, {calibration['num_tokens']:,} tokens"
                + (", chat template" if calibration.get("chat_template") else "")
                + ")",
            )
        )
    if selection.get("coverage") is not None:
        rows.append(("coverage", f"{selection['coverage']:.2%} of the counted tokens are kept"))
    if selection.get("kept_unseen"):
        rows.append(("kept but never seen", f"{selection['kept_unseen']:,} (filled by lowest id)"))
    rows.append(("special tokens (always kept)", f"{len(selection.get('special_token_ids', []))}"))
    rows.append(("ties", selection.get("tie_break", "lower token id first")))
    return rows


def _files(rdk: bool, with_tokenizer: bool) -> list[tuple[str, str]]:
    """The rows of a pruned drafter card's file list: what `PrunedVocabDrafter.push_to_hub` uploads."""
    head = "`kept_token_ids`, the sliced head rows unless the head is tied to the input embedding" + (
        ", and the RDK kernel (`rdk_indices`, `rdk_weights`)" if rdk else "")
    rows = [
        ("`config.json`, `generation_config.json`", "the base model's configs (full vocabulary size)"),
        ("`model.safetensors`", "the base model's backbone (no LM head)"),
        ("`pruned_head.safetensors`", head),
        ("`pruning_config.json`", "how the keep set (and kernel) were chosen: the facts in the table above"),
    ]
    if with_tokenizer:
        rows.append(("tokenizer files", "the base model's tokenizer"))
    rows.append(("`custom_generate/`", "hf_semspec's decoding method for `generate(custom_generate=...)`"))
    return rows


def pruned_drafter_card(info: dict, license: str | None = None, repo_id: str | None = None,
                        with_tokenizer: bool = True):
    """The README of a pruned drafter (`info` = its `pruning_config.json`), as a checked `ModelCard`.

    `license` is the license of the uploaded weights (default: the base model's, `info["license"]`, recorded when the
    drafter was made); `with_tokenizer` says whether tokenizer files go with the weights (the card's file list)."""
    from huggingface_hub import ModelCardData

    base_model = info.get("base_model")
    recorded = info.get("license")  # the base model's, as read (or given) when the drafter was made
    license_value = license or recorded or DEFAULT_LICENSE
    # The base card's name and link of its license (how a license "other" names its terms).
    base_terms = {key: info[key] for key in ("license_name", "license_link") if info.get(key)}
    named = ", ".join(
        value for value in (f"`{base_terms['license_name']}`" if "license_name" in base_terms else None,
                            base_terms.get("license_link")) if value
    )
    base_license = f"`{recorded}`{f' ({named})' if named else ''}" if recorded else None
    if license_value == recorded:
        license_note = f"{base_license}, the license of the base model, applies to these weights."
    elif license:
        # Another license than the recorded one: the uploader's choice, which the card must not call the base's.
        license_note = (
            f"The uploader set the license `{license_value}` for these weights. They are derived from the base model"
            f"{f' (`{base_model}`)' if base_model else ''}, whose license "
            + (f"was recorded as {base_license} when this drafter was made" if base_license
               else "could not be determined when this drafter was made")
            + "; check that its terms allow this one."
        )
    else:
        license_note = (
            f"The base model's license could not be determined when this drafter was made, so the metadata says "
            f"`{DEFAULT_LICENSE}`: the license of the base model{f' (`{base_model}`)' if base_model else ''} applies "
            "to these weights; check it before use."
        )
    terms = base_terms if license_value == recorded else {}
    rdk = info.get("rdk")
    tags = ["hf_semspec", "speculative-decoding", "draft-model", "pruned-vocabulary"] + (["rdk"] if rdk else [])
    data = ModelCardData(
        library_name="hf_semspec",
        base_model=base_model,
        license=license_value,
        **terms,
        tags=tags,
        pipeline_tag="text-generation",
    )
    vocab_size, keep_size = info["vocab_size"], info["keep_size"]
    fraction = keep_size / vocab_size
    tied = info.get("tied_head", False)
    facts = [
        ("base model", f"`{base_model}`" if base_model else "unknown"),
        ("vocabulary (target ids)", f"{vocab_size:,}"),
        ("kept output tokens", f"{keep_size:,} ({fraction:.1%})"),
        (
            "LM head",
            "tied to the input embedding: only the kept ids are stored, the head rows are rebuilt from the embedding"
            if tied
            else f"untied: the {keep_size:,} kept rows are stored",
        ),
        *_describe_selection(info.get("selection", {})),
    ]
    if rdk and "neighbours" in rdk:  # built by prune_vocabulary(..., rdk=True)
        facts += [
            ("RDK kernel", f"each kept token → itself + {rdk['neighbours']} most similar pruned tokens"),
            ("RDK similarity", rdk["similarity"]),
            ("RDK temperature τ", rdk["temperature"]),
            ("RDK mean self weight", f"{rdk['mean_self_weight']:.3f}"),
        ]
    elif rdk:  # installed with set_rdk_kernel
        facts += [
            ("RDK kernel", f"set with `set_rdk_kernel`: each kept token → {rdk['entries_per_row']} target ids"),
            ("RDK mean self weight", f"{rdk['mean_self_weight']:.3f}"),
        ]
    else:
        facts.append(("RDK kernel", "none (use `acceptance=\"exact\"`)"))
    repo = repo_id or "<this repo>"
    rule = "rdk" if rdk else "exact"
    title = f"{repo_id.split('/')[-1] if repo_id else 'Pruned drafter'}"
    text = _render(
        PRUNED_DRAFTER_TEMPLATE,
        {
            "card_data": data.to_yaml(),
            "title": title,
            "base_model": f"[`{base_model}`](https://huggingface.co/{base_model})" if base_model else "its base model",
            "keep_size": f"{keep_size:,}",
            "vocab_size": f"{vocab_size:,}",
            "keep_percent": f"{fraction:.1%}",
            "facts_table": _table(("", ""), facts),
            "repo_id": repo,
            "rule": rule,
            "rdk_section": (
                "This drafter carries an RDK kernel, so `acceptance=\"rdk\"` can draft tokens outside its kept "
                "vocabulary (Timor et al. 2025); verification stays lossless."
                if rdk
                else "This drafter has no RDK kernel; build one with `prune_vocabulary(..., rdk=True)` for "
                "`acceptance=\"rdk\"`."
            ),
            "license_note": license_note,
            "files_table": _table(("file", "content"), _files(bool(rdk), with_tokenizer)),
        },
    )
    return parse_and_check_card(text, REQUIRED_METADATA + (("base_model",) if base_model else ()))


# ---------------------------------------------------------------------------------------------------------------------
# custom_generate repo
# ---------------------------------------------------------------------------------------------------------------------


def _summary(component: type) -> str:
    module_doc = (sys.modules[component.__module__].__doc__ or "").strip().split("\n\n")[0]
    return " ".join(module_doc.split())


def _options_table(config_class: type) -> str:
    rows = [
        (f"`{f['name']}`", f["type"], f"`{f['default']!r}`", f["allowed"] if f["allowed"] is not None else "any", f["help"])
        for f in config_class.field_docs()
    ]
    if not rows:
        return "No options."
    return _table(("option", "type", "default", "allowed", "meaning"), rows)


def render_custom_generate_card() -> str:
    """The README of a Hub `custom_generate` repo of hf_semspec: description, compatible models, every registered
    acceptance rule and draft-length policy with all options (type, default, allowed range, meaning), example usage,
    and the papers. Rendered from `hf_semspec.rules.RULES` and `hf_semspec.draft_length.POLICIES`, so a newly
    registered component appears without editing the template."""
    from huggingface_hub import ModelCardData

    import hf_semspec
    from hf_semspec.draft_length import POLICIES
    from hf_semspec.rules import RULES

    rule_rows = []
    rule_sections = []
    citations = []
    for name in RULES.names():
        rule = RULES.get(name)
        modes = "/".join(m for m, ok in (("greedy", rule.supports_greedy), ("sampling", rule.supports_sampling)) if ok)
        extra = []
        if rule.redistributes_draft:
            extra.append("needs a pruned drafter with an RDK kernel (`hf_semspec.drafters.prune_vocabulary(..., rdk=True)`)")
        if rule.requires_target_hidden_states:
            extra.append("reads the target's LM-head input")
        rule_rows.append(
            (f"`{name}`", "yes" if rule.lossless else "no", modes, rule.default_num_draft_tokens, rule.paper or "—", "; ".join(extra) or "—")
        )
        rule_sections.append(f"#### `acceptance=\"{name}\"`\n\n{_summary(rule)}\n\n{_options_table(rule.config_class)}")
        if rule.paper:
            citations.append(f"- `acceptance=\"{name}\"`: {rule.paper}")
    policy_sections = []
    for name in POLICIES.names():
        policy = POLICIES.get(name)
        length = f" `num_assistant_tokens` sets `{policy.length_field}`." if policy.length_field else ""
        policy_sections.append(
            f"#### `draft_length=\"{name}\"`\n\n{_summary(policy)}{length}\n\n{_options_table(policy.config_class)}"
        )
        if policy.paper:
            citations.append(f"- `draft_length=\"{name}\"`: {policy.paper}")
    data = ModelCardData(
        library_name="transformers",
        license="apache-2.0",
        tags=["custom_generate", "hf_semspec", "speculative-decoding"],
    )
    text = _render(
        CUSTOM_GENERATE_TEMPLATE,
        {
            "card_data": data.to_yaml(),
            "version": hf_semspec.__version__,
            "lossless_rules": ", ".join(f"`{n}`" for n in RULES.names() if RULES.get(n).lossless) or "none",
            "lossy_rules": ", ".join(f"`{n}`" for n in RULES.names() if not RULES.get(n).lossless) or "none",
            "rules_table": _table(("acceptance", "lossless", "decoding", "default γ", "paper", "notes"), rule_rows),
            "rule_sections": "\n\n".join(rule_sections),
            "policy_names": ", ".join(f"`{n}`" for n in POLICIES.names()),
            "policy_sections": "\n\n".join(policy_sections),
            "citations": "\n".join(citations),
        },
    )
    parse_and_check_card(text)
    return text


def custom_generate_card():
    """`render_custom_generate_card()` as a `huggingface_hub.ModelCard`."""
    return parse_and_check_card(render_custom_generate_card())
