"""Pruned-vocabulary drafters: build, save, load and share a draft model whose output head keeps K of N tokens.

    from hf_semspec.drafters import prune_vocabulary, PrunedVocabDrafter

    drafter = prune_vocabulary(draft_model, tokenizer, corpus="prompts.jsonl", keep=0.25, rdk=True)
    drafter.save_pretrained("qwen-0.5b-pruned/")
    drafter = PrunedVocabDrafter.from_pretrained("qwen-0.5b-pruned/")
    target.generate(**inputs, assistant_model=drafter, acceptance="exact")   # or acceptance="rdk"

- `keep_set`: corpus reading, token counting, calibration generations, special tokens, keep-set selection;
- `kernel`: the RDK affinity kernel (what is the paper's and what is ours is said there);
- `pruned`: `PrunedVocabDrafter` (the pruned-drafter protocol of `hf_semspec.drafting.ModelDrafter`) and
  `prune_vocabulary`;
- `cards`: model cards for a drafter's Hub repo and for an hf_semspec `custom_generate` repo.
"""

from .cards import custom_generate_card, pruned_drafter_card, render_custom_generate_card
from .keep_set import load_corpus_texts, select_kept_ids, special_token_ids
from .kernel import DEFAULT_NEIGHBOURS, DEFAULT_TEMPERATURE, build_rdk_kernel, check_rdk_kernel
from .pruned import PrunedVocabDrafter, copy_custom_generate, prune_vocabulary

__all__ = [
    "DEFAULT_NEIGHBOURS",
    "DEFAULT_TEMPERATURE",
    "PrunedVocabDrafter",
    "build_rdk_kernel",
    "check_rdk_kernel",
    "copy_custom_generate",
    "custom_generate_card",
    "load_corpus_texts",
    "prune_vocabulary",
    "pruned_drafter_card",
    "render_custom_generate_card",
    "select_kept_ids",
    "special_token_ids",
]
