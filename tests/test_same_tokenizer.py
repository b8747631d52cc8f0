"""`assert_same_tokenizer` (hf_semspec/drafters/same_tokenizer.py): what `prune_vocabulary` and the benchmarks'
model loader check a draft's tokenizer with."""

from __future__ import annotations

import pytest

from hf_semspec.drafters.same_tokenizer import assert_same_tokenizer



def _tiny_tokenizer(extra_vocab: dict[str, int] | None = None, chat_template: str | None = None, eos: str = "<s>"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"a": 0, "b": 1, "ab": 2, "<s>": 3, "</s>": 4, **(extra_vocab or {})}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos)
    tokenizer.chat_template = chat_template
    return tokenizer


def test_assert_same_tokenizer_accepts_identical_tokenizers():
    assert_same_tokenizer(_tiny_tokenizer(chat_template="{{ x }}"), _tiny_tokenizer(chat_template="{{ x }}"))


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (dict(extra_vocab={"c": 5}), r"vocabulary differs.*only in b: \['c'\]"),
        (
            dict(chat_template="{{ y }}"),
            r"chat template differs .*line 1, column 4: '\{\{ x \}\}' vs '\{\{ y \}\}'.*check_chat_template=False",
        ),
        (dict(eos="</s>"), "special tokens differ"),
    ],
)
def test_assert_same_tokenizer_names_the_difference(other, message):
    reference = _tiny_tokenizer(chat_template="{{ x }}")
    changed = _tiny_tokenizer(**{"chat_template": "{{ x }}", **other})
    with pytest.raises(ValueError, match=message):
        assert_same_tokenizer(reference, changed)


def test_assert_same_tokenizer_can_skip_only_the_chat_template():
    template_x, template_y = "{{ messages[0]['content'] }}", "{{ messages[0]['content'] }}{# other revision #}"
    reference = _tiny_tokenizer(chat_template=template_x)
    with pytest.raises(ValueError, match="a plain user/assistant conversation renders the same"):
        assert_same_tokenizer(reference, _tiny_tokenizer(chat_template=template_y))

    assert_same_tokenizer(reference, _tiny_tokenizer(chat_template=template_y), check_chat_template=False)
    with pytest.raises(ValueError, match="vocabulary differs") as info:
        assert_same_tokenizer(
            reference, _tiny_tokenizer(extra_vocab={"c": 5}, chat_template=template_y), check_chat_template=False
        )
    assert "chat template" not in str(info.value)
