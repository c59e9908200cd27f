"""Each reach of `mlxserve.compat` into mlx-lm's and mlx-vlm's internals still finds what it
needs on the installed versions: a failure here names what an upgrade moved."""

from __future__ import annotations

import inspect

import mlx.core as mx
import mlx_vlm.models.qwen2_vl.language as qwen2_vl_language
import pytest
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

from mlxserve import compat
from mlxserve.models.tokenizer import ExactBPEDetokenizer, load_text_tokenizer


@pytest.fixture(scope="module")
def wrapper(tiny_model):
    return load_text_tokenizer(tiny_model, trust_remote_code=False)


def test_the_hugging_face_tokenizer_inside_the_wrapper(wrapper):
    hf = compat.hf_tokenizer(wrapper)
    assert hf.chat_template and hf.convert_ids_to_tokens(hf.encode("Paris"))


def test_the_detokenizer_prototype_is_replaced_by_the_exact_one(wrapper):
    assert type(compat.detokenizer_prototype(wrapper)) is ExactBPEDetokenizer
    assert callable(getattr(BPEStreamingDetokenizer, compat.TRIM_SPACE_HOOK))
    detokenizer = wrapper.detokenizer  # a copy of the prototype
    for token in compat.hf_tokenizer(wrapper).encode(" Paris"):
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert detokenizer.text == " Paris"


def test_the_byte_level_alphabet():
    decoder = compat.byte_decoder()
    assert len(decoder) == 256 and sorted(decoder.values()) == list(range(256))


def test_model_classes_from_a_config():
    model_class, args_class = compat.model_classes({"model_type": "qwen3"})
    assert (model_class.__name__, args_class.__name__) == ("Model", "ModelArgs")


def test_the_generation_batch_state_speculation_uses(tiny_model):
    from mlx_lm import load

    model, _ = load(str(tiny_model))
    generator = BatchGenerator(model)
    assert isinstance(generator._generation_batch, GenerationBatch)
    batch = GenerationBatch.empty(model, make_sampler())
    missing = [name for name in compat.GENERATION_BATCH_STATE if not hasattr(batch, name)]
    assert not missing, f"mlx-lm's GenerationBatch no longer has {missing}"
    compat.install_generation_batch(generator, batch)
    assert generator._generation_batch is batch
    # its `next` still steps through `_step`, which the adapter routes to `decode_step`
    assert "self._step()" in inspect.getsource(GenerationBatch.next)
    adapter = compat.GenerationBatchAdapter.empty(model, make_sampler())
    assert isinstance(adapter, compat.GenerationBatchAdapter)
    assert adapter.generated == [] and adapter.next_tokens.size == 0


def test_rows_in_the_prompt_stage_are_seen(tiny_model):
    """`prompt_stage`: a row is queued, then in its prompt pass, then generating."""
    from mlx_lm import load

    model, _ = load(str(tiny_model))
    generator = BatchGenerator(model)
    assert not compat.prompt_stage(generator)
    generator.insert([[5, 6, 7, 8]], max_tokens=[4])
    assert compat.prompt_stage(generator)  # queued
    generator.next()
    assert compat.prompt_stage(generator)  # its prompt processed but for the last token
    generator.next()
    assert not compat.prompt_stage(generator)
    assert len(compat.generation_batch(generator)) == 1
    generator.close()


def test_a_token_context_is_read_without_changing_it():
    """`tokens_seen` reads mlx-lm's TokenBuffer (a padded array and its `_size`)."""
    from mlx_lm.models.cache import TokenBuffer

    class Rows(compat.GenerationBatchAdapter):
        def __init__(self, context: TokenBuffer):
            self._token_context = [context]

    context = TokenBuffer([3, 4])
    context.update_and_fetch(mx.array([5]))
    assert Rows(context).tokens_seen(0).tolist() == [3, 4, 5]
    assert context.update_and_fetch(mx.array([6])).tolist() == [3, 4, 5, 6]


@pytest.mark.parametrize("rejoins", ["in place", "beside a running row"])
def test_a_batch_set_aside_goes_on_where_it_stopped(tiny_model, rejoins):
    """What parking idle-priority rows does (engine/continuous/parking.py): mlx-lm's batch set aside
    whole for an empty one of its class while another row runs, then back in place (or,
    if that row still runs, joined to it). Its rows' tokens are those of a run never set
    aside, and its own cache extraction still reads a row's tokens and caches."""
    from mlx_lm import load

    model, _ = load(str(tiny_model))
    prompts = [[1, 2, 3, 4], [5, 6, 7]]

    def run(aside_at: int | None) -> dict[int, list[int]]:
        generator = BatchGenerator(model, stop_tokens=[[-1]])
        uids = generator.insert(prompts, max_tokens=[12, 12])
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        for step in range(40):
            if step == aside_at:
                parked = compat.generation_batch(generator)
                sibling = compat.empty_like(parked)
                assert type(sibling) is type(parked) and not sibling.uids
                compat.install_generation_batch(generator, sibling)
                (other,) = generator.insert([[9, 10, 11]], max_tokens=[30])
                while not sibling.uids:  # the other row's prompt, then its first step
                    generator.next()
                assert parked.tokens[0][:4] == prompts[0]
                assert len(parked.extract_cache(1)) == len(parked.prompt_cache)
                if rejoins == "in place":
                    generator.remove([other])
                    compat.install_generation_batch(generator, parked)
                else:
                    sibling.extend(parked)
            for r in generator.next()[1]:
                if r.uid in tokens:
                    tokens[r.uid].append(r.token)
        generator.close()
        return tokens

    assert run(aside_at=5) == run(aside_at=None)
    assert all(len(t) == 12 for t in run(aside_at=5).values())


def test_qwen_vl_keeps_positions_where_they_are_forgotten():
    source = inspect.getsource(qwen2_vl_language)
    assert all(f"self.{name}" in source for name in compat.VISION_POSITION_STATE)


def test_chat_templates_compile_as_transformers_renders_them():
    compat.compile_chat_template("{% generation %}{{ messages[0].content }}{% endgeneration %}")
    with pytest.raises(Exception, match="endfo"):
        compat.compile_chat_template("{% for m in messages %}{% endfo %}")


def test_gated_delta_layers_convolve_and_recur_as_recorded():
    """`engine/recurrent_steps` records what these layers hand their `conv1d` and each
    position of their module's `gated_delta_update`, into a cache of two slots."""
    for layer in compat.gated_delta_layers():
        source = inspect.getsource(layer.__call__)
        assert "self.conv1d(conv_input)" in source and "gated_delta_update(" in source
        assert "cache[0] =" in source and "cache[1] = state" in source
        assert callable(inspect.getmodule(layer).gated_delta_update)


def test_mlx_vlm_qwen3_5_stays_batched_when_asked_for_hidden_states():
    """`compat.batched_pass_kwargs`: its model splits a left-padded pass into rows unless
    a hidden-state sink is given, which its language model makes from `capture_layer_ids`."""
    from mlx_vlm.models.qwen3_5.language import LanguageModel, Qwen3_5Model

    assert "hidden_sink is None" in inspect.getsource(Qwen3_5Model.__call__)
    language = inspect.getsource(LanguageModel.__call__)
    assert "[] if capture_layer_ids is not None else None" in language
