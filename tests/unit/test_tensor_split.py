"""Which head counts a tensor split accepts: mlx-lm's own `shard` of a real qwen3 model
(its layers built from a config, weights never read) over a group of 2, 3 or 4 ranks
(splitting only slices arrays: no rank has to exist), and an architecture that repeats
its key-value heads where there are fewer than the ranks."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn
import pytest
from mlx_lm.models import qwen3

from mlxserve.distributed.tensor_split import NotSplittable, library_shard


@dataclass(frozen=True)
class Group:
    """What a split reads of an mx.distributed.Group."""

    ranks: int

    def size(self) -> int:
        return self.ranks

    def rank(self) -> int:
        return 0


def qwen3_model(heads: int, kv_heads: int) -> qwen3.Model:
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=heads * 16,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-6,
        vocab_size=32,
        max_position_embeddings=256,
        rope_theta=10000.0,
        head_dim=16,
        tie_word_embeddings=True,
    )
    return qwen3.Model(args)


def test_heads_that_divide_are_split():
    model = qwen3_model(heads=4, kv_heads=2)
    library_shard(model, model.shard, Group(2))
    attention = model.layers[0].self_attn
    assert (attention.n_heads, attention.n_kv_heads) == (2, 1)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "ranks", "refused"),
    [
        (4, 2, 3, "its attention heads (4) do not divide among 3 ranks"),
        (4, 1, 2, "its key-value heads (1) do not divide among 2 ranks"),  # none left a rank
        (4, 2, 4, "its key-value heads (2) do not divide among 4 ranks"),
    ],
)
def test_heads_that_do_not_divide_are_refused(heads, kv_heads, ranks, refused):
    model = qwen3_model(heads, kv_heads)
    with pytest.raises(NotSplittable) as refusal:
        library_shard(model, model.shard, Group(ranks))
    assert str(refusal.value) == refused


class Attention(nn.Module):
    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads = heads, kv_heads


class Layer(nn.Module):
    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.self_attn = Attention(heads, kv_heads)


class Repeating(nn.Module):
    """An architecture whose `shard` repeats its key-value heads where the ranks outnumber
    them (as mlx-lm's Qwen3.5 does): each rank keeps one."""

    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.layers = [Layer(heads, kv_heads) for _ in range(2)]

    def shard(self, group: Group) -> None:
        for layer in self.layers:
            attention = layer.self_attn
            attention.n_heads //= group.size()
            attention.n_kv_heads = max(1, attention.n_kv_heads // group.size())


def test_key_value_heads_fewer_than_the_ranks_pass_where_the_architecture_repeats_them():
    model = Repeating(heads=8, kv_heads=2)
    library_shard(model, model.shard, Group(4))
    assert (model.layers[0].self_attn.n_heads, model.layers[0].self_attn.n_kv_heads) == (2, 1)
    with pytest.raises(NotSplittable, match="key-value heads \\(2\\) do not divide among 3"):
        library_shard(Repeating(heads=6, kv_heads=2), Repeating.shard, Group(3))
