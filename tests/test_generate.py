"""End to end on tiny models: the `exact` rule reproduces plain greedy decoding and stock assisted generation, and
honours what transformers' generate() honours (processors, stopping, EOS, lengths, masks, streamers, outputs)."""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, VOCAB, batch_of, perturbed_copy, prompt, tiny_llama, tiny_tokenizer
from transformers import (
    DynamicCache,
    GenerationConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation import EosTokenCriteria, MaxLengthCriteria, StopStringCriteria
from transformers.generation.streamers import BaseStreamer

import hf_semspec
from hf_semspec import SpeculativeDecoderOnlyOutput
from hf_semspec._transformers_compat import CACHE_ARGUMENT
from hf_semspec.errors import SemSpecConfigError


def plain_greedy(model, ids, **kwargs):
    return type(model).generate(model, ids, do_sample=False, **kwargs)


@pytest.mark.parametrize("draft_name", ["self", "close", "unrelated"])
@pytest.mark.parametrize("num_assistant_tokens", [1, 4, 9])
def test_exact_greedy_matches_plain_and_stock_assisted(
    attached, close_draft, unrelated_draft, draft_name, num_assistant_tokens, monkeypatch
):
    draft = {"self": attached, "close": close_draft, "unrelated": unrelated_draft}[draft_name]
    for seed in range(3):
        ids = prompt(6 + seed, seed=seed)
        plain = plain_greedy(attached, ids, max_new_tokens=40)
        ours = attached.generate(
            ids, assistant_model=draft, acceptance="exact", num_assistant_tokens=num_assistant_tokens, max_new_tokens=40
        )
        # Stock assisted generation reads γ from the draft's generation config, not from the call.
        # (The models are the session's: monkeypatch restores their configs for the tests after this one.)
        monkeypatch.setattr(draft.generation_config, "num_assistant_tokens", num_assistant_tokens)
        monkeypatch.setattr(draft.generation_config, "num_assistant_tokens_schedule", "constant")
        stock = plain_greedy(attached, ids, assistant_model=draft, max_new_tokens=40)
        assert torch.equal(ours, plain), (draft_name, seed)
        assert torch.equal(ours, stock), (draft_name, seed)


def test_acceptance_extremes_show_in_stats(attached, unrelated_draft):
    ids = prompt(8)
    same = attached.generate(
        ids, assistant_model=attached, acceptance="exact", num_assistant_tokens=4, max_new_tokens=21,
        min_new_tokens=21, return_dict_in_generate=True,
    )
    stats = same.acceptance_stats
    assert isinstance(same, SpeculativeDecoderOnlyOutput)
    assert stats.acceptance_rate == 1.0
    # 21 tokens in rounds of 4 + 1: four full rounds (20) and a last round capped to γ = 0.
    assert stats.num_target_forwards == 5 and stats.num_new_tokens == 21
    assert stats.mean_accepted_length == pytest.approx(21 / 5)
    assert stats.drafted_per_position == [4, 4, 4, 4] and stats.accepted_per_position == [4, 4, 4, 4]

    other = attached.generate(
        ids, assistant_model=unrelated_draft, acceptance="exact", num_assistant_tokens=4, max_new_tokens=21,
        min_new_tokens=21, return_dict_in_generate=True,
    ).acceptance_stats
    assert other.acceptance_rate < 0.2
    assert other.num_new_tokens == 21
    assert other.num_target_forwards >= 21 * 0.8
    assert other.num_accepted == other.num_new_tokens - other.num_target_forwards


def test_sampling_is_reproducible_and_differs_across_seeds(attached, close_draft):
    ids = prompt(8)
    outs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        outs.append(
            attached.generate(ids, assistant_model=close_draft, acceptance="exact", do_sample=True, max_new_tokens=30)
        )
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    assert outs[0].shape[1] <= ids.shape[1] + 30
    assert int(outs[0].max()) < VOCAB


def test_generation_config_json_roundtrip_gives_same_result(attached, close_draft, tmp_path):
    ids = prompt(8)
    cfg = GenerationConfig(max_new_tokens=25, acceptance="exact", acceptance_kwargs={}, num_assistant_tokens=3)
    cfg.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert loaded.acceptance == "exact" and loaded.acceptance_kwargs == {}
    from_config = attached.generate(ids, assistant_model=close_draft, generation_config=loaded, return_dict_in_generate=True)
    from_kwargs = attached.generate(
        ids, assistant_model=close_draft, acceptance="exact", acceptance_kwargs={}, num_assistant_tokens=3,
        max_new_tokens=25, return_dict_in_generate=True,
    )
    assert torch.equal(from_config.sequences, from_kwargs.sequences)
    assert from_config.acceptance_stats == from_kwargs.acceptance_stats
    assert from_config.acceptance_stats.drafted_per_position[0] > 0
    assert len(from_config.acceptance_stats.drafted_per_position) == 3  # γ came from the JSON config


def test_saved_model_keeps_acceptance_on_reload(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_llama(seed=5)
    model.generation_config.acceptance = "exact"  # set by hand: transformers saves it with `_from_model_config`
    model.generation_config.acceptance_kwargs = {}
    model.save_pretrained(tmp_path / "by_hand")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "by_hand")
    assert getattr(reloaded.generation_config, "acceptance", None) is None  # what transformers alone does
    hf_semspec.attach(reloaded)
    assert reloaded.generation_config.acceptance == "exact"

    model2 = hf_semspec.attach(tiny_llama(seed=5), acceptance="exact", acceptance_kwargs={})
    model2.save_pretrained(tmp_path / "via_attach")
    reloaded2 = AutoModelForCausalLM.from_pretrained(tmp_path / "via_attach")
    assert reloaded2.generation_config.acceptance == "exact"  # kept even without attach()


def test_numpy_options_of_a_default_rule_are_saved_as_pythons(tmp_path):
    # They were stored as given: save_pretrained then failed halfway ("float32 is not JSON serializable").
    import numpy as np
    from transformers import AutoModelForCausalLM

    given = {"window": np.int64(3), "entropy_threshold": np.float32(0.25)}
    model = hf_semspec.attach(tiny_llama(seed=5), acceptance="fly", acceptance_kwargs=given)
    assert model.generation_config.acceptance_kwargs == {"window": 3, "entropy_threshold": 0.25}
    assert [type(v) for v in model.generation_config.acceptance_kwargs.values()] == [int, float]
    model.save_pretrained(tmp_path / "numpy")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "numpy")
    assert reloaded.generation_config.acceptance_kwargs == {"window": 3, "entropy_threshold": 0.25}


def test_model_default_acceptance_without_draft_is_plain_decoding(target):
    model = hf_semspec.attach(tiny_llama(seed=0), acceptance="exact")
    ids = prompt(8)
    assert torch.equal(model.generate(ids, max_new_tokens=12), plain_greedy(target, ids, max_new_tokens=12))
    out = model.generate(ids, assistant_model=target, max_new_tokens=12, return_dict_in_generate=True)
    assert out.acceptance_stats is not None  # with a draft, the model's default rule applies


def test_passing_the_models_own_generation_config_keeps_its_default_rule_a_default(target, close_draft):
    # As evaluation harnesses call generate(generation_config=model.generation_config, ...) (or a copy of it): the
    # default rule stays off without a draft, instead of turning into a request that needs one.
    import copy

    model = hf_semspec.attach(tiny_llama(seed=0), acceptance="fly", acceptance_kwargs={"window": 3})
    expected = plain_greedy(target, prompt(8), max_new_tokens=12)
    for config in (model.generation_config, copy.deepcopy(model.generation_config)):
        assert torch.equal(model.generate(prompt(8), generation_config=config, max_new_tokens=12), expected)
        out = model.generate(prompt(8), generation_config=config, assistant_model=close_draft, max_new_tokens=12,
                             return_dict_in_generate=True)
        assert out.acceptance_stats is not None  # with a draft, the rule decodes
    # Another rule or other options in a passed config are a request for them, which needs a draft.
    for changed in ({"acceptance": "exact"}, {"acceptance_kwargs": {"window": 2}}):
        config = copy.deepcopy(model.generation_config)
        config.update(**changed)
        with pytest.raises(SemSpecConfigError, match=r"`assistant_model` = None .*Fix: pass assistant_model"):
            model.generate(prompt(8), generation_config=config, max_new_tokens=12)


def test_options_for_a_model_default_rule_without_a_draft_are_an_error(target):
    # Without a draft the model's default rule is off: these options (a typo too) did nothing, silently.
    model = hf_semspec.attach(tiny_llama(seed=0), acceptance="fly")
    for options in ({"draft_length": "tapot"}, {"acceptance_kwargs": {"windw": 3}}, {"draft_length_kwargs": {"x": 1}},
                    {"generation_config": GenerationConfig(max_new_tokens=4, draft_length="tapout")}):
        field = next(iter(options)) if "generation_config" not in options else "generation_config.draft_length"
        with pytest.raises(SemSpecConfigError, match=rf"`{field}` = .* is not valid: allowed None without "
                                                     r"assistant_model \(the model's default acceptance='fly'"):
            model.generate(prompt(8), max_new_tokens=4, **options)


def test_acceptance_none_in_the_call_turns_the_models_default_off(target, close_draft):
    # As an explicit None overrides a generation config in transformers: stock assisted generation for this call.
    model = hf_semspec.attach(tiny_llama(seed=0), acceptance="fly")
    out = model.generate(prompt(8), assistant_model=close_draft, acceptance=None, max_new_tokens=12,
                         return_dict_in_generate=True)
    assert not hasattr(out, "acceptance_stats")
    assert torch.equal(out.sequences, plain_greedy(target, prompt(8), max_new_tokens=12))
    with pytest.raises(SemSpecConfigError, match=r"`acceptance_kwargs` = \{'window': 2\} is not valid: allowed None "
                                                 r"with acceptance=None"):
        model.generate(prompt(8), assistant_model=close_draft, acceptance=None, acceptance_kwargs={"window": 2})


def test_an_attached_model_pickles_and_copies_attached(attached, close_draft):
    # A bound method pickled as a lookup of `generate`, which on load found the class's: the copy lost attach() and
    # failed with transformers' "model_kwargs are not used" error.
    import copy
    import inspect
    import pickle

    for restored in (pickle.loads(pickle.dumps(attached)), copy.deepcopy(attached)):
        assert restored.generate.model is restored
        assert list(inspect.signature(restored.generate).parameters)[:2] == ["inputs", "generation_config"]  # bound
        out = restored.generate(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=12)
        assert torch.equal(out, plain_greedy(attached, prompt(8), max_new_tokens=12))
        hf_semspec.detach(restored)
        assert "generate" not in vars(restored)
    # The method alone, as multiprocessing sends it: it brings its own copy of the model and keeps it alive.
    for method in (pickle.loads(pickle.dumps(attached.generate)), copy.deepcopy(attached.generate)):
        assert method.model is not attached and method.__name__ == "generate"
        out = method(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=12)
        assert torch.equal(out, plain_greedy(attached, prompt(8), max_new_tokens=12))
    method, model = copy.deepcopy([attached.generate, attached])  # one object, as pickle keeps it
    assert method is model.generate and method.model is model
    shallow = copy.copy(attached)  # shares the original's installed generate: detach removes it from the copy too
    hf_semspec.detach(shallow)
    assert "generate" not in vars(shallow) and "generate" in vars(attached)


def test_a_deleted_attached_model_is_freed_at_once(close_draft):
    # attach stored functools.partial(generate, model) on the model: a cycle, so `del model` freed nothing (GPU memory
    # included) until the garbage collector's next full pass. Reference counting alone must free it, as without attach.
    import gc
    import weakref

    import copy

    model = hf_semspec.attach(tiny_llama(seed=0))
    model.generate(prompt(8), assistant_model=close_draft, acceptance="exact", draft_length="cost_aware",
                   max_new_tokens=6)  # a kept policy too
    deep = copy.deepcopy(model)  # a deep copy owns its own, weakly bound too
    assert deep.generate.model is deep
    method, ref, deep_ref = model.generate, weakref.ref(model), weakref.ref(deep)
    gc.disable()
    try:
        del model, deep
        assert ref() is None and deep_ref() is None
    finally:
        gc.enable()
    with pytest.raises(ReferenceError, match=r"deleted.*Fix: call `generate` on a model you hold"):
        method(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=2)


def test_without_acceptance_generate_is_stock(attached, close_draft):
    ids = prompt(8)
    assert torch.equal(attached.generate(ids, max_new_tokens=15), plain_greedy(attached, ids, max_new_tokens=15))
    out = attached.generate(ids, assistant_model=close_draft, max_new_tokens=15, return_dict_in_generate=True)
    assert not hasattr(out, "acceptance_stats")  # stock assisted generation's output class


def test_attach_is_per_instance(target):
    other = tiny_llama(seed=0)
    hf_semspec.attach(other)
    assert "generate" in vars(other) and "generate" not in vars(target)
    assert type(other).generate is type(target).generate  # the class is untouched
    hf_semspec.detach(other)
    assert "generate" not in vars(other)


def test_eos_inside_accepted_drafts_stops_there(attached):
    ids = prompt(8)
    plain = plain_greedy(attached, ids, max_new_tokens=30)
    generated = plain[0, ids.shape[1] :].tolist()
    stop_token = generated[10]  # make the 11th greedy token the EOS: it lies inside a fully accepted draft block
    first = generated.index(stop_token)
    ours = attached.generate(
        ids, assistant_model=attached, acceptance="exact", num_assistant_tokens=8, max_new_tokens=30,
        eos_token_id=stop_token, pad_token_id=0, return_dict_in_generate=True,
    )
    assert ours.sequences[0, ids.shape[1] :].tolist() == generated[: first + 1]
    assert torch.equal(ours.sequences, plain_greedy(attached, ids, max_new_tokens=30, eos_token_id=stop_token, pad_token_id=0))


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 7, 13])
def test_max_length_reached_mid_draft(attached, max_new_tokens):
    ids = prompt(8)
    ours = attached.generate(
        ids, assistant_model=attached, acceptance="exact", num_assistant_tokens=6,
        max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
    )
    assert ours.shape[1] == ids.shape[1] + max_new_tokens
    assert torch.equal(ours, plain_greedy(attached, ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens))


def test_min_new_tokens_and_repetition_penalty_are_applied(attached, close_draft):
    ids = prompt(8)
    kwargs = dict(max_new_tokens=30, min_new_tokens=25, repetition_penalty=1.3, no_repeat_ngram_size=2)
    plain = plain_greedy(attached, ids, **kwargs)
    ours = attached.generate(ids, assistant_model=close_draft, acceptance="exact", **kwargs)
    assert torch.equal(ours, plain)
    unpenalised = plain_greedy(attached, ids, max_new_tokens=30)
    assert not torch.equal(plain, unpenalised)  # the processors change the output, so the check above has teeth


def test_scores_and_logits_match_plain_greedy(attached, close_draft):
    ids = prompt(8)
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, return_dict_in_generate=True, output_scores=True, output_logits=True, repetition_penalty=1.2)
    plain = plain_greedy(attached, ids, **kwargs)
    ours = attached.generate(ids, assistant_model=close_draft, acceptance="exact", **kwargs)
    assert len(ours.scores) == len(plain.scores) == 12
    for a, b in zip(ours.scores, plain.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.logits, plain.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ours.scores[0], ours.logits[0])  # scores are processed, logits raw


def test_left_padded_prompt_matches_plain(attached, close_draft):
    ids = prompt(8)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], dim=1)
    plain = plain_greedy(attached, padded, attention_mask=mask, max_new_tokens=20)
    ours = attached.generate(padded, attention_mask=mask, assistant_model=close_draft, acceptance="exact", max_new_tokens=20)
    assert torch.equal(ours, plain)


class Recorder(BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_prompt_then_every_new_token(attached, close_draft):
    ids = prompt(8)
    recorder = Recorder()
    out = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=20, streamer=recorder)
    assert recorder.ended
    assert recorder.chunks[0] == ids[0].tolist()
    assert sum(recorder.chunks[1:], []) == out[0, ids.shape[1] :].tolist()
    assert len(recorder.chunks) > 2  # several rounds


def test_a_streamer_is_ended_when_the_loop_refuses_an_option(attached, close_draft):
    # transformers streams the prompt before the loop's checks run: without an end, a TextIteratorStreamer consumer
    # in another thread would wait forever.
    from transformers import TextIteratorStreamer

    recorder = Recorder()
    with pytest.raises(SemSpecConfigError, match=r"`cache_implementation` = 'offloaded'"):
        attached.generate(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=4,
                          cache_implementation="offloaded", streamer=recorder)
    assert recorder.chunks == [prompt(8)[0].tolist()] and recorder.ended
    iterator = TextIteratorStreamer(tiny_tokenizer(), skip_prompt=True, timeout=5)
    with pytest.raises(SemSpecConfigError, match=r"`cache_implementation` = 'offloaded'"):
        attached.generate(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=4,
                          cache_implementation="offloaded", streamer=iterator)
    assert "".join(iterator) == ""  # ends at once instead of raising queue.Empty after the timeout


class StopAfter(StoppingCriteria):
    def __init__(self, length):
        self.length = length
        self.calls = []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append(input_ids.shape[1])
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


class StopAtToken(StoppingCriteria):
    """Fires when the last token is `token`: only a check after each token sees it."""

    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_custom_stopping_criteria_stop_where_plain_decoding_stops(attached, close_draft):
    ids = prompt(8)
    stop = StopAfter(ids.shape[1] + 7)
    out = attached.generate(
        ids, assistant_model=attached, acceptance="exact", num_assistant_tokens=4, max_new_tokens=40,
        min_new_tokens=40, stopping_criteria=StoppingCriteriaList([stop]),
    )
    # Rounds emit 5 tokens (draft == target); the criterion is called after each of them, as in plain decoding,
    # so the second round is cut after its 2nd token, not at the round's end (length 18).
    assert out.shape[1] == ids.shape[1] + 7 and stop.calls == list(range(ids.shape[1] + 1, ids.shape[1] + 8))
    generated = plain_greedy(attached, ids, max_new_tokens=30)[0, ids.shape[1] :].tolist()
    criteria = {"length": lambda: StopAfter(ids.shape[1] + 7), "token": lambda: StopAtToken(generated[8])}
    for name, make in criteria.items():
        for draft in (attached, close_draft):
            ours = attached.generate(ids, assistant_model=draft, acceptance="exact", num_assistant_tokens=6,
                                     max_new_tokens=30, stopping_criteria=StoppingCriteriaList([make()]))
            plain = plain_greedy(attached, ids, max_new_tokens=30, stopping_criteria=StoppingCriteriaList([make()]))
            assert plain.shape[1] < ids.shape[1] + 30 and torch.equal(ours, plain), name


class EosAfterMinimum(EosTokenCriteria):
    """A subclass with its own decision: EOS stops only once the sequence reaches `minimum` tokens."""

    def __init__(self, eos_token_id, minimum):
        super().__init__(eos_token_id)
        self.minimum = minimum

    def __call__(self, input_ids, scores, **kwargs):
        return super().__call__(input_ids, scores) & (input_ids.shape[1] >= self.minimum)


def test_a_subclassed_eos_criterion_keeps_its_own_decision(attached, close_draft):
    # It was read as a plain EosTokenCriteria: its ids, stopped at by the loop, and its own __call__ never called.
    ids = prompt(8)
    generated = plain_greedy(attached, ids, max_new_tokens=30)[0, ids.shape[1]:].tolist()
    eos = generated[2]  # a token that appears early: the criterion must let it pass until the minimum
    criteria = lambda: StoppingCriteriaList([EosAfterMinimum(eos, ids.shape[1] + 12)])  # noqa: E731
    plain = plain_greedy(attached, ids, max_new_tokens=30, stopping_criteria=criteria())
    ours = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=30,
                             stopping_criteria=criteria())
    assert plain.shape[1] > ids.shape[1] + 3 and torch.equal(ours, plain)


def test_stopping_criteria_get_the_scores_plain_decoding_passes(attached, close_draft):
    # With output_scores, a criterion is passed the processed scores so far: one per token, the one just chosen
    # included, as plain decoding passes them.
    class RecordScores(StoppingCriteria):
        def __init__(self):
            self.seen = []

        def __call__(self, input_ids, scores, **kwargs):
            self.seen.append((input_ids.shape[1], len(scores)))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    ids, ours, plain = prompt(8), RecordScores(), RecordScores()
    attached.generate(ids, assistant_model=close_draft, acceptance="exact", num_assistant_tokens=4,
                      max_new_tokens=10, output_scores=True, return_dict_in_generate=True,
                      stopping_criteria=StoppingCriteriaList([ours]))
    plain_greedy(attached, ids, max_new_tokens=10, output_scores=True, return_dict_in_generate=True,
                 stopping_criteria=StoppingCriteriaList([plain]))
    assert ours.seen == plain.seen == [(ids.shape[1] + n, n) for n in range(1, 11)]


def test_the_shortest_of_two_max_length_criteria_stops(attached):
    ids = prompt(8)
    criteria = StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + 6), MaxLengthCriteria(ids.shape[1] + 3)])
    ours = attached.generate(ids, assistant_model=attached, acceptance="exact", max_new_tokens=12,
                             stopping_criteria=criteria)
    assert ours.shape[1] == ids.shape[1] + 3
    assert torch.equal(ours, plain_greedy(attached, ids, max_new_tokens=12, stopping_criteria=criteria))


@pytest.mark.parametrize("new_tokens", [4, 30])
def test_a_max_length_criterion_given_by_the_user_takes_precedence(attached, new_tokens):
    # transformers keeps the user's MaxLengthCriteria instead of its own, shorter or longer.
    ids = prompt(8)
    criteria = StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + new_tokens)])
    ours = attached.generate(ids, assistant_model=attached, acceptance="exact", max_new_tokens=12,
                             stopping_criteria=criteria)
    assert ours.shape[1] == ids.shape[1] + new_tokens
    assert torch.equal(ours, plain_greedy(attached, ids, max_new_tokens=12, stopping_criteria=criteria))


@pytest.mark.parametrize("max_length, padded", [(8, False), (5, False), (5, True)])
def test_a_max_length_criterion_at_or_below_the_prompt_still_adds_one_token(attached, close_draft, max_length, padded):
    # Plain decoding appends a token before it checks the criteria; the loop gave 0 tokens, or a raw RuntimeError.
    ids = prompt(8)
    mask = torch.ones_like(ids)
    mask[:, 0] = 0
    kwargs = dict(max_new_tokens=10, attention_mask=mask if padded else None,
                  stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(max_length)]))
    ours = attached.generate(ids, assistant_model=close_draft, acceptance="exact", return_dict_in_generate=True,
                             **kwargs)
    assert ours.sequences.shape[1] == ids.shape[1] + 1
    assert torch.equal(ours.sequences, plain_greedy(attached, ids, **kwargs))
    assert getattr(ours, CACHE_ARGUMENT).get_seq_length() == ids.shape[1]  # as plain decoding leaves it


def test_position_ids_are_refused(attached, close_draft):
    # They were dropped: the loop derives positions from the mask and the cache (a GPT-2 offset changed the text).
    ids = prompt(8)
    with pytest.raises(SemSpecConfigError, match=r"`position_ids` = 'a tensor' is not valid: allowed None with an "
                                                 r"acceptance rule .*Fix: remove position_ids"):
        attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=4,
                          position_ids=torch.arange(8)[None] + 30)


@pytest.mark.parametrize("cached, given", [(6, "the new ids"), (10, "the whole prompt")])
def test_a_cache_must_come_with_the_whole_sequence(attached, close_draft, cached, given):
    # transformers can restart from a cache and only the new ids (with the full mask); the loop needs the whole
    # sequence, and failed with a raw shape error.
    ids = prompt(10, seed=2)
    cache = DynamicCache(config=attached.config)
    attached(ids[:, :cached], **{CACHE_ARGUMENT: cache}, use_cache=True)
    passed = ids[:, 6:] if given == "the new ids" else ids
    with pytest.raises(SemSpecConfigError, match=rf"`input_ids` = '{passed.shape[1]} tokens with a {CACHE_ARGUMENT} of "
                                                 rf"{cached} and an attention_mask of 10' is not valid: allowed the "
                                                 r"whole sequence"):
        attached.generate(passed, attention_mask=torch.ones_like(ids), **{CACHE_ARGUMENT: cache},
                          assistant_model=close_draft, acceptance="exact", max_new_tokens=4)


@pytest.mark.parametrize(
    "model_default, given",
    [
        (None, {"stop_strings": "STOP"}),  # a str, as transformers takes it
        (None, {"generation_config": GenerationConfig(stop_strings=["STOP"], max_new_tokens=30)}),
        (["STOP"], {}),
        (["STOP"], {"generation_config": GenerationConfig(max_new_tokens=30)}),
        (["other"], {"generation_config": GenerationConfig(stop_strings=["STOP"], max_new_tokens=30)}),
        (["STOP"], {"stop_strings": None}),  # the call's None turns the model's default off
        (None, {"stopping_criteria": "a StopStringCriteria"}),
        (["other"], {"stop_strings": ["other"], "stopping_criteria": "a StopStringCriteria"}),  # the user's replaces
    ],
)
def test_stop_strings_stop_where_plain_decoding_stops(attached, close_draft, model_default, given):
    tokenizer = tiny_tokenizer()
    ids = prompt(8)
    generated = plain_greedy(attached, ids, max_new_tokens=30)[0, ids.shape[1] :].tolist()
    stop_at = next(i for i in range(5, 30) if generated.index(generated[i]) == i)  # a token new after round one
    words = {"STOP": tokenizer.convert_ids_to_tokens(generated[stop_at]),
             "other": tokenizer.convert_ids_to_tokens(generated[1])}  # a stop before it

    def spelled(value):
        return words.get(value, value) if isinstance(value, str) else value and [words[v] for v in value]

    def arguments():  # fresh criteria for each call
        out = {"max_new_tokens": 30, "tokenizer": tokenizer}
        for key, value in given.items():
            if key == "stop_strings":
                out[key] = spelled(value)
            elif key == "generation_config":
                out[key] = GenerationConfig(**{**value.to_diff_dict(), "stop_strings": spelled(value.stop_strings)})
            else:
                out[key] = StoppingCriteriaList([StopStringCriteria(tokenizer, [words["STOP"]])])
        return out

    attached.generation_config.stop_strings = spelled(model_default)
    try:
        plain = plain_greedy(attached, ids, **arguments())
        ours = attached.generate(ids, assistant_model=close_draft, acceptance="exact", num_assistant_tokens=5,
                                 **arguments())
    finally:
        attached.generation_config.stop_strings = None
    assert torch.equal(ours, plain)
    stopped_at = {ids.shape[1] + stop_at + 1: "STOP", ids.shape[1] + 2: "other", ids.shape[1] + 30: None}
    assert stopped_at[plain.shape[1]] == ("STOP" if given.get("stop_strings", "STOP") is not None else None)


@pytest.mark.parametrize("cut", ["eos", "criterion"])  # (max_new_tokens caps γ: it never cuts a round)
def test_returned_cache_ends_where_the_output_does(attached, cut):
    # A round cut inside its accepted drafts must not leave their keys and values in the cache: a follow-up
    # call that reuses the cache would read tokens the output does not have.
    ids = prompt(8)
    generated = plain_greedy(attached, ids, max_new_tokens=40)[0, ids.shape[1] :].tolist()
    stop = generated[10]
    limits = {
        "eos": {"eos_token_id": stop, "pad_token_id": 0, "max_new_tokens": 30},
        "criterion": {"stopping_criteria": StoppingCriteriaList([StopAfter(ids.shape[1] + 11)]), "max_new_tokens": 30},
    }[cut]
    ours = attached.generate(ids, assistant_model=attached, acceptance="exact", num_assistant_tokens=8,
                             return_dict_in_generate=True, **limits)
    sequences = ours.sequences
    assert sequences.shape[1] < ids.shape[1] + 30
    returned_cache = getattr(ours, CACHE_ARGUMENT)
    assert returned_cache.get_seq_length() == sequences.shape[1] - 1  # as plain decoding leaves it
    again = plain_greedy(attached, sequences, **{CACHE_ARGUMENT: returned_cache}, max_new_tokens=5)
    assert torch.equal(again, plain_greedy(attached, sequences, max_new_tokens=5))


def test_dynamic_cache_implementation_is_the_loops_own(attached, close_draft):
    ids = prompt(8)
    ours = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=20,
                             cache_implementation="dynamic")
    assert torch.equal(ours, plain_greedy(attached, ids, max_new_tokens=20))


def test_bf16_draft_with_fp32_target(attached, close_draft):
    draft = perturbed_copy(attached, scale=0.3, seed=2).to(torch.bfloat16)
    ids = prompt(8)
    ours = attached.generate(ids, assistant_model=draft, acceptance="exact", max_new_tokens=25)
    assert torch.equal(ours, plain_greedy(attached, ids, max_new_tokens=25))


def sliding_window_qwen2(eos_token_id=EOS) -> Qwen2ForCausalLM:
    """A tiny Qwen2 whose two layers both attend over a window of 6 tokens."""
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, use_sliding_window=True, sliding_window=6, max_window_layers=0,
        max_position_embeddings=256, eos_token_id=eos_token_id, pad_token_id=0,
    )
    assert config.layer_types == ["sliding_attention"] * 2
    return Qwen2ForCausalLM(config).eval()


def test_sliding_window_model_rolls_back_correctly():
    model = sliding_window_qwen2()
    config = model.config
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    draft = perturbed_copy(model, 0.3, seed=4)
    hf_semspec.attach(model)
    ids = prompt(10)
    ours = model.generate(ids, assistant_model=draft, acceptance="exact", num_assistant_tokens=4, max_new_tokens=30,
                          return_dict_in_generate=True)
    assert torch.equal(ours.sequences, plain_greedy(model, ids, max_new_tokens=30))
    # The returned cache stops recording its past, as plain decoding's: a continuation keeps each layer's window
    # (it kept every token, growing without bound).
    returned_cache = getattr(ours, CACHE_ARGUMENT)
    assert [layer.record_past for layer in returned_cache.layers] == [False, False]
    again = type(model).generate(model, ours.sequences, **{CACHE_ARGUMENT: returned_cache}, max_new_tokens=20,
                                 do_sample=False, return_dict_in_generate=True)
    assert [layer.keys.shape[-2] for layer in getattr(again, CACHE_ARGUMENT).layers] == [config.sliding_window - 1] * 2


def test_the_draft_cache_keeps_its_window_while_rounds_are_fully_accepted():
    # With past recording on, crop(0) is what cuts a sliding-window layer back: the draft's cache skipped it after a
    # fully accepted round and grew as if it had full attention (206 positions for a window of 6 over 200 tokens).
    from transformers import LogitsProcessorList

    from hf_semspec.drafting import ModelDrafter
    from hf_semspec.processors import BatchProcessors

    model = sliding_window_qwen2(eos_token_id=None)
    config = model.config
    drafter = ModelDrafter(model, BatchProcessors(LogitsProcessorList(), 1), do_sample=False, return_probs=False,
                           output_device=torch.device("cpu"), vocab_size=VOCAB)
    batch = batch_of(prompt(10))
    for _ in range(5):  # every draft accepted: the rollback removes nothing
        batch.reserve(batch.num_slots + 5)
        batch.reserve_tokens(batch.lengths[0] + 5)
        block = drafter.draft(batch, 4)
        batch.commit(torch.tensor([4]), block.tokens[:, -1], accepted=[4], kept=[5])
        drafter.runner.rewind(batch.num_slots - 1)
    assert [layer.keys.shape[-2] for layer in drafter.cache.layers] == [config.sliding_window - 1] * 2


def test_a_sliding_window_draft_with_one_token_to_make():
    # The first round drafts nothing: the draft's cache is still empty, and cropping its sliding layers crashed.
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    draft = MistralForCausalLM(MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, sliding_window=6, eos_token_id=EOS, pad_token_id=0,
    )).eval()
    target = tiny_llama(seed=0)
    ours = hf_semspec.generate(target, prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=1)
    assert torch.equal(ours, plain_greedy(target, prompt(8), max_new_tokens=1))


def test_stateful_models_are_refused():
    # A recurrent state kept the rejected drafts after a rollback: exact's output differed from plain decoding.
    # transformers refuses them for assisted generation too.
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=VOCAB, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, num_experts=0, layer_types=["linear_attention", "full_attention"],
        eos_token_id=EOS, pad_token_id=0,
    )
    torch.manual_seed(0)
    stateful = Qwen3NextForCausalLM(config).eval()
    attention_only = tiny_llama(seed=0)
    from hf_semspec.drafters import prune_vocabulary

    pruned = prune_vocabulary(stateful, tiny_tokenizer(), keep_ids=list(range(4, 40)))  # a stateful backbone too
    for model, draft, named in ((stateful, attention_only, "model \\(Qwen3NextForCausalLM\\)"),
                                (attention_only, stateful, "assistant_model \\(Qwen3NextForCausalLM\\)"),
                                (attention_only, pruned, "assistant_model \\(PrunedVocabDrafter\\)")):
        with pytest.raises(SemSpecConfigError, match=rf"`{named}` = 'a stateful model .* is not valid: allowed models "
                                                     r"whose cache can be rolled back"):
            hf_semspec.generate(model, prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=4)


def test_eos_token_in_stats_counts_only_kept_tokens(attached):
    ids = prompt(8)
    plain = plain_greedy(attached, ids, max_new_tokens=30)
    stop_token = plain[0, ids.shape[1] + 2].item()
    out = attached.generate(
        ids, assistant_model=attached, acceptance="exact", num_assistant_tokens=8, max_new_tokens=30,
        eos_token_id=stop_token, pad_token_id=0, return_dict_in_generate=True,
    )
    assert out.acceptance_stats.num_new_tokens == out.sequences.shape[1] - ids.shape[1] == 3
    assert out.acceptance_stats.num_target_forwards == 1
    # The rule's verdicts, as documented: all 8 drafts accepted, though the output ends at the 3rd token.
    assert out.acceptance_stats.num_accepted == 8 and out.acceptance_stats.accepted_per_position == [1] * 8


def test_options_in_a_passed_config_apply_to_the_models_rule(attached, close_draft, monkeypatch):
    # transformers lets each field of a passed config win over the model's: acceptance_kwargs too, for the rule
    # named in the model's config (as the call's acceptance_kwargs do).
    from hf_semspec.generation import _resolve_component

    monkeypatch.setattr(attached.generation_config, "acceptance", "fly", raising=False)
    monkeypatch.setattr(attached.generation_config, "acceptance_kwargs", {"window": 2}, raising=False)
    passed = GenerationConfig(acceptance_kwargs={"window": 3})
    fields = ("acceptance", "acceptance_kwargs")
    assert _resolve_component(None, None, fields, passed, attached.generation_config) == ("fly", {"window": 3}, "model")
    assert _resolve_component(None, {"window": 4}, fields, passed, attached.generation_config)[1] == {"window": 4}
    # A rule named in the passed config keeps its own options, not the model's rule's.
    named = GenerationConfig(acceptance="exact")
    assert _resolve_component(None, None, fields, named, attached.generation_config) == ("exact", None, "generation_config")
    passed_options = attached.generate(
        prompt(6), assistant_model=close_draft, return_dict_in_generate=True,
        generation_config=GenerationConfig(acceptance_kwargs={"window": 3}, max_new_tokens=12),
    )
    call_options = attached.generate(prompt(6), assistant_model=close_draft, acceptance_kwargs={"window": 3},
                                     max_new_tokens=12, return_dict_in_generate=True)
    assert torch.equal(passed_options.sequences, call_options.sequences)
    assert passed_options.acceptance_stats == call_options.acceptance_stats


def test_a_config_instance_is_not_changed_by_the_call(attached, close_draft):
    from hf_semspec.draft_length.constant import ConstantConfig

    config = ConstantConfig()  # num_tokens unset: generate() fills it in for its own copy
    first = attached.generate(prompt(6), assistant_model=close_draft, acceptance="exact", draft_length="constant",
                              draft_length_kwargs=config, num_assistant_tokens=2, max_new_tokens=12,
                              return_dict_in_generate=True)
    assert config.num_tokens is None
    second = attached.generate(prompt(6), assistant_model=close_draft, acceptance="exact", draft_length="constant",
                               draft_length_kwargs=config, max_new_tokens=12, return_dict_in_generate=True)
    assert len(first.acceptance_stats.drafted_per_position) == 2
    assert len(second.acceptance_stats.drafted_per_position) == hf_semspec.rules.RULES.get("exact").default_num_draft_tokens


def test_attach_takes_a_rule_config_instance(tmp_path):
    from hf_semspec.rules.fly import FLyConfig

    model = hf_semspec.attach(tiny_llama(seed=5), acceptance="fly", acceptance_kwargs=FLyConfig(window=3))
    assert model.generation_config.acceptance_kwargs["window"] == 3
    model.save_pretrained(tmp_path)  # stored as a dict: the JSON takes it
    assert '"window": 3' in (tmp_path / "generation_config.json").read_text()


@pytest.mark.parametrize("where", ["num_assistant_tokens", "schedule"])
def test_the_drafts_generation_config_is_read_last(attached, close_draft, monkeypatch, where):
    # Stock assisted generation reads γ and the schedule from the draft's generation config; so do we, where the
    # call, a passed config and the target's set nothing.
    ids = prompt(6)
    if where == "num_assistant_tokens":
        monkeypatch.setattr(close_draft.generation_config, "num_assistant_tokens", 2)
        out = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=12,
                                return_dict_in_generate=True)
        assert len(out.acceptance_stats.drafted_per_position) == 2
        called = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=12,
                                   num_assistant_tokens=3, return_dict_in_generate=True)
        assert len(called.acceptance_stats.drafted_per_position) == 3  # the call wins
    else:
        monkeypatch.setattr(close_draft.generation_config, "num_assistant_tokens_schedule", "heuristic_transient")
        out = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=30,
                                num_assistant_tokens=2, return_dict_in_generate=True)
        # The heuristic's rounds grow by 2 after a full acceptance: more positions than the starting 2.
        assert len(out.acceptance_stats.drafted_per_position) > 2
        named = attached.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=30,
                                  num_assistant_tokens=2, draft_length="constant", return_dict_in_generate=True)
        assert len(named.acceptance_stats.drafted_per_position) == 2  # a policy named in the call wins


@pytest.mark.parametrize(
    "options, drafted",
    [
        ({"draft_length": "constant", "draft_length_kwargs": {"num_tokens": 4}}, 4),  # the options win
        ({"draft_length": "heuristic", "draft_length_kwargs": {"max_tokens": 6}}, 6),  # the draft's 10, capped at 6
        ({"draft_length": "constant", "draft_length_kwargs": "ConstantConfig(num_tokens=4)"}, 4),
        ({}, 10),  # nothing else set: the draft's own length
    ],
)
def test_the_drafts_length_is_a_default_that_never_conflicts(attached, close_draft, monkeypatch, options, drafted):
    # Set up for stock assisted generation; the call does not pass num_assistant_tokens, so nothing conflicts.
    from hf_semspec.draft_length.constant import ConstantConfig

    monkeypatch.setattr(close_draft.generation_config, "num_assistant_tokens", 10)
    if options.get("draft_length_kwargs") == "ConstantConfig(num_tokens=4)":
        options = {**options, "draft_length_kwargs": ConstantConfig(num_tokens=4)}
    out = attached.generate(prompt(6), assistant_model=close_draft, acceptance="exact", max_new_tokens=30,
                            min_new_tokens=30, return_dict_in_generate=True, **options)
    assert len(out.acceptance_stats.drafted_per_position) == drafted  # the longest round


def test_a_config_instances_own_length_conflicts_with_the_calls_as_a_dicts_does(attached, close_draft):
    from hf_semspec.draft_length.constant import ConstantConfig

    for options in ({"num_tokens": 4}, ConstantConfig(num_tokens=4)):
        with pytest.raises(hf_semspec.SemSpecConfigError, match=r"`draft_length_kwargs\['num_tokens'\]` = 4 .*"
                                                                r"num_assistant_tokens=2"):
            attached.generate(prompt(6), assistant_model=close_draft, acceptance="exact", draft_length="constant",
                              draft_length_kwargs=options, num_assistant_tokens=2, max_new_tokens=4)


def test_options_merge_as_transformers_merges_a_call_into_configs(attached, close_draft, monkeypatch):
    from hf_semspec.generation import _resolve_component

    fields = ("acceptance", "acceptance_kwargs")
    model = attached.generation_config
    monkeypatch.setattr(model, "acceptance", "fly", raising=False)
    monkeypatch.setattr(model, "acceptance_kwargs", {"window": 2}, raising=False)
    # The call names the model's rule: the model's options for it stay (field by field), unless the call gives its own.
    assert _resolve_component("fly", None, fields, None, model) == ("fly", {"window": 2}, "call")
    assert _resolve_component("fly", {"window": 4}, fields, None, model)[1] == {"window": 4}
    # ... and a passed config's options for it come before the model's.
    assert _resolve_component("fly", None, fields, GenerationConfig(acceptance_kwargs={"window": 3}), model)[1] == {"window": 3}
    assert _resolve_component("fly", None, fields, GenerationConfig(acceptance="fly", acceptance_kwargs={"window": 3}),
                              model)[1] == {"window": 3}
    # Another rule's options never follow its name's loss.
    assert _resolve_component("ears", None, fields, None, model) == ("ears", None, "call")
    assert _resolve_component("fly", None, fields, GenerationConfig(acceptance="ears", acceptance_kwargs={"beta": 0.2}),
                              model)[1] == {"window": 2}
    out = attached.generate(prompt(6), assistant_model=close_draft, acceptance="fly", max_new_tokens=12,
                            generation_config=GenerationConfig(acceptance_kwargs={"window": 3}, max_new_tokens=12),
                            return_dict_in_generate=True)
    again = attached.generate(prompt(6), assistant_model=close_draft, acceptance="fly", acceptance_kwargs={"window": 3},
                              max_new_tokens=12, return_dict_in_generate=True)
    assert torch.equal(out.sequences, again.sequences) and out.acceptance_stats == again.acceptance_stats
