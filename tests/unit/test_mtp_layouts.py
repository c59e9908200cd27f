"""Every family whose MTP head mlxserve reads: a head written into a checkpoint under its
family's names (and in the form its published checkpoints use) is read back exactly.

The end-to-end tests (test_mtp.py) serve trained fixtures of two of these families; this
covers the loader for the others too (Qwen3-Next's mixture-of-experts head, DeepSeek-V3's
latent attention), and the form the served fixtures are not written in (GLM-4.5's and
DeepSeek-V3's experts stored one by one, as Hugging Face stores them)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from hybrid_fixture import QWEN_EXPERTS
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes
from mtp_fixture import TINY_GLM_MTP, TINY_QWEN35_MTP, checkpoint_names

from mlxserve.engine.drafters.mtp_load import FAMILIES, load_head, new_head

CONFIGS = {
    "qwen3_5": TINY_QWEN35_MTP.config,
    "qwen3_next": {
        **{k: v for k, v in TINY_QWEN35_MTP.config.items() if k != "rope_parameters"},
        **QWEN_EXPERTS,
        "model_type": "qwen3_next",
        "partial_rotary_factor": 0.5,
        "attention_bias": False,
    },
    "glm4_moe": TINY_GLM_MTP.config,
    # DeepSeek-V3 itself has 61 layers, and mlx-lm drops its head by that name
    # (`model.layers.61`): a served fixture would need as many (400 s to train here), so
    # its head is covered here, on 2 layers.
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "routed_scaling_factor": 1.0,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "qk_nope_head_dim": 16,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "num_nextn_predict_layers": 1,
    },
}
EXPERTS_ONE_BY_ONE = {"glm4_moe", "deepseek_v3"}  # as their Hugging Face checkpoints are


def test_every_family_has_a_case():
    assert set(CONFIGS) == set(FAMILIES)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_a_head_in_its_familys_checkpoint_is_read_back_exactly(model_type, tmp_path):
    import json

    mx.random.seed(1)
    config = {**CONFIGS[model_type], "vocab_size": 97}
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    head = new_head(model, FAMILIES[model_type])
    mx.eval(model.parameters(), head.parameters())
    written = checkpoint_names(head, model)
    if model_type in EXPERTS_ONE_BY_ONE:
        written = _experts_one_by_one(written)
    weights = {**dict(tree_flatten(model.parameters())), **written}
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    (tmp_path / "config.json").write_text(json.dumps(config))

    read = load_head(model, tmp_path)
    assert read is not None
    tokens = mx.array([[3, 14, 15, 92]])
    hidden = mx.random.normal((1, 4, config["hidden_size"]))
    expected, expected_chain = head(tokens, hidden, [None])
    got, chain = read(tokens, hidden, [None])
    assert mx.allclose(got, expected, atol=1e-5).item()
    assert mx.allclose(chain, expected_chain, atol=1e-5).item()


def _experts_one_by_one(weights: dict) -> dict:
    """Stacked expert projections (`switch_mlp.<proj>.weight`, experts x out x in) back to
    one tensor per expert (`experts.<e>.<proj>.weight`)."""
    out = {}
    for key, value in weights.items():
        if ".switch_mlp." in key:
            before, after = key.split(".switch_mlp.")
            for e in range(value.shape[0]):
                out[f"{before}.experts.{e}.{after}"] = value[e]
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(
    ("config", "exact"),
    [
        (TINY_GLM_MTP.config, True),
        (TINY_QWEN35_MTP.config, True),
        (
            {
                "model_type": "gemma2",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "rms_norm_eps": 1e-6,
                "query_pre_attn_scalar": 16,
                "final_logit_softcapping": 1.0,
            },
            False,
        ),
    ],
    ids=["glm4_moe", "qwen3_5", "gemma2-softcapped"],
)
def test_a_model_is_split_before_its_output_head_only_where_that_is_all_it_does(config, exact):
    """A drafter's hidden states come from the model split before its output head; Gemma
    2 caps its logits after the head, so the split would verify drafts against other
    logits, and it is not made."""
    from mlxserve.engine.drafters.hidden import splits_exactly

    mx.random.seed(2)
    model_class, args_class = _get_classes({**config, "vocab_size": 97})
    model = model_class(args_class.from_dict({**config, "vocab_size": 97}))
    assert splits_exactly(model) is exact
