"""sentence-transformers pooling configs and the pooling itself, on hand-made hidden
states of a right-padded batch (the end-to-end tests cover last-token and mean pooling
through real models; CLS is only here)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from mlxserve.models.embedding import Pooling, _pool, pooling_of

# two inputs, of 3 and 1 tokens, hidden size 2; the padding rows hold 99s
HIDDEN = mx.array([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[7.0, 8.0], [99.0, 99.0], [99.0, 99.0]]])
LENGTHS = mx.array([3, 1])
MASK = mx.arange(3)[None, :] < LENGTHS[:, None]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("cls", [[1, 2], [7, 8]]),
        ("lasttoken", [[5, 6], [7, 8]]),
        ("mean", [[3, 4], [7, 8]]),
    ],
)
def test_pooling_ignores_padding(mode, expected):
    np.testing.assert_allclose(np.array(_pool(HIDDEN, MASK, LENGTHS, mode)), expected)


def folder(root, flags: dict, extra_modules: tuple[str, ...] = ("Normalize",)):
    """A sentence-transformers folder with this pooling config and modules after it."""
    root.mkdir()
    types = ["Transformer", "Pooling", *extra_modules]
    modules = [
        {"idx": i, "name": str(i), "path": "1_Pooling" if t == "Pooling" else "", "type": t}
        for i, t in enumerate(types)
    ]
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    return root


def test_pooling_configs(tmp_path):
    cls = folder(tmp_path / "a", {"pooling_mode_cls_token": True})
    assert pooling_of(cls) == Pooling("cls", normalize=True)
    plain = folder(tmp_path / "b", {"pooling_mode_mean_tokens": True}, ())
    assert pooling_of(plain) == Pooling("mean", normalize=False)
    two = folder(tmp_path / "c", {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})
    with pytest.raises(ValueError, match="unsupported pooling"):
        pooling_of(two)
    dense = folder(tmp_path / "d", {"pooling_mode_mean_tokens": True}, ("Dense", "Normalize"))
    with pytest.raises(ValueError, match="Dense module"):
        pooling_of(dense)


def test_embedding_batches_are_bounded_and_cover_every_input():
    from mlxserve.engine.loop.sharing import batches

    inputs = [[1] * n for n in (5, 300, 1, 40, 40, 40, 2, 600)]
    found = batches(inputs, tokens=100, most=3)
    assert sorted(i for batch in found for i in batch) == list(range(len(inputs)))
    for batch in found:
        longest = max(len(inputs[i]) for i in batch)
        assert len(batch) <= 3 and (len(batch) == 1 or len(batch) * longest <= 100)
    assert found[0] == [2, 6, 0]  # shortest first
    assert [1] in found and [7] in found  # longer than the budget: alone
