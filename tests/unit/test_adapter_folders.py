"""Adapter folders read into updates in mlx-lm's orientation (y += scale * (x @ a) @ b),
from either layout, with the scale each layout means; and the folders that are no
adapter we serve, refused with what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from mlxserve.adapters.folder import AdapterError, adapter_files, read_adapter
from mlxserve.adapters.layers import ModelAdapters
from mlxserve.settings import LoraOption, lora_option

MODULE = "model.layers.0.self_attn.q_proj"


def mlx_folder(tmp_path: Path, config: dict, tensors: dict) -> Path:
    folder = tmp_path / "mlx"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "adapters.safetensors"), tensors)
    return folder


def peft_folder(tmp_path: Path, config: dict, tensors: dict) -> Path:
    folder = tmp_path / "peft"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
    mx.save_safetensors(str(folder / "adapter_model.safetensors"), tensors)
    return folder


A = mx.arange(8 * 2, dtype=mx.float32).reshape(8, 2)  # in 8, rank 2
B = mx.arange(2 * 4, dtype=mx.float32).reshape(2, 4)  # rank 2, out 4
PAIR = {f"{MODULE}.lora_a": A, f"{MODULE}.lora_b": B}


def test_mlx_lm_layout_with_its_scale(tmp_path):
    config = {"fine_tune_type": "lora", "lora_parameters": {"rank": 2, "scale": 7.0}}
    folder = mlx_folder(tmp_path, config, {f"{MODULE}.lora_a": A, f"{MODULE}.lora_b": B})
    weights = read_adapter(folder)
    (update,) = weights.updates.values()
    assert list(weights.updates) == [MODULE] and weights.kind == "lora"
    assert update.scale == 7.0 and update.magnitude is None
    assert mx.array_equal(update.a, A) and mx.array_equal(update.b, B)
    assert weights.nbytes == A.nbytes + B.nbytes


@pytest.mark.parametrize(
    ("config", "scale"),
    [
        ({"r": 2, "lora_alpha": 16}, 8.0),  # alpha / r
        ({"r": 2, "lora_alpha": 16, "use_rslora": True}, 16 / 2**0.5),  # alpha / sqrt(r)
        ({"r": 2, "lora_alpha": 16, "alpha_pattern": {"q_proj": 4}}, 2.0),
    ],
    ids=["alpha", "rslora", "alpha-pattern"],
)
def test_peft_layout_is_transposed_and_scaled(tmp_path, config, scale):
    prefix = f"base_model.model.{MODULE}"
    tensors = {f"{prefix}.lora_A.weight": A.T, f"{prefix}.lora_B.weight": B.T}
    (update,) = read_adapter(peft_folder(tmp_path, config, tensors)).updates.values()
    assert update.scale == pytest.approx(scale)
    assert mx.array_equal(update.a, A) and mx.array_equal(update.b, B)


def test_peft_dora_keeps_its_magnitude(tmp_path):
    prefix = f"base_model.model.{MODULE}"
    tensors = {
        f"{prefix}.lora_A.weight": A.T,
        f"{prefix}.lora_B.weight": B.T,
        f"{prefix}.lora_magnitude_vector": mx.ones((4,)),
    }
    config = {"r": 2, "lora_alpha": 2, "use_dora": True}
    weights = read_adapter(peft_folder(tmp_path, config, tensors))
    assert weights.kind == "dora"
    assert weights.updates[MODULE].magnitude is not None


def test_the_fingerprint_follows_the_weights(tmp_path):
    config = {"lora_parameters": {"scale": 1.0}}
    first = read_adapter(
        mlx_folder(tmp_path, config, {f"{MODULE}.lora_a": A, f"{MODULE}.lora_b": B})
    )
    mx.save_safetensors(
        str(tmp_path / "mlx" / "adapters.safetensors"),
        {f"{MODULE}.lora_a": A + 1, f"{MODULE}.lora_b": B},
    )
    assert read_adapter(tmp_path / "mlx").fingerprint != first.fingerprint


@pytest.mark.parametrize(
    ("config", "tensors", "says"),
    [
        ({"fine_tune_type": "full"}, PAIR, "a full fine-tune is a model of its own"),
        ({"fine_tune_type": "vera"}, PAIR, "fine_tune_type 'vera' is not served"),
        ({}, {f"{MODULE}.lora_a": A}, "has no B matrix"),
        ({}, {f"{MODULE}.lora_a": A, f"{MODULE}.lora_b": B[:1]}, "their ranks differ"),
        ({}, {f"{MODULE}.weight": A}, "is not a LoRA or DoRA weight"),
        ({}, {}, "holds no low-rank updates"),
    ],
    ids=["full", "other-kind", "half", "ranks", "not-lora", "empty"],
)
def test_what_is_refused(tmp_path, config, tensors, says):
    folder = mlx_folder(tmp_path, config, tensors)
    with pytest.raises(AdapterError, match=says):
        read_adapter(folder)


def test_peft_extras_we_do_not_serve(tmp_path):
    with pytest.raises(AdapterError, match="modules_to_save"):
        adapter_files(peft_folder(tmp_path, {"modules_to_save": ["lm_head"]}, {"x": A}))
    with pytest.raises(AdapterError, match="PEFT IA3 adapter is not served"):
        folder = tmp_path / "ia3"
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
        (folder / "adapter_model.safetensors").write_bytes(b"")
        adapter_files(folder)


def test_rows_get_their_own_adapter_as_mlx_lm_computes_it(tmp_path):
    """One batch of three rows (base, adapter one, adapter two) through a wrapped linear
    layer: each row equals mlx-lm's LoRALinear with that adapter alone; after one adapter
    is removed, the other's rows still get theirs."""
    import mlx.nn as nn
    from mlx_lm.tuner.lora import LoRALinear

    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    base = model.layers[0]
    x = mx.random.normal((3, 2, 8))
    adapters = ModelAdapters(model)
    expected = {}
    for name, rank, scale in (("one", 2, 3.0), ("two", 5, 0.5)):
        a, b = mx.random.normal((8, rank)), mx.random.normal((rank, 4))
        folder = tmp_path / name
        folder.mkdir()
        config = {"lora_parameters": {"scale": scale}}
        (folder / "adapter_config.json").write_text(json.dumps(config))
        tensors = {"layers.0.lora_a": a, "layers.0.lora_b": b}
        mx.save_safetensors(str(folder / "adapters.safetensors"), tensors)
        adapters.add(name, folder, read_adapter(folder))
        alone = LoRALinear.from_base(base, r=rank, scale=scale)
        alone.lora_a, alone.lora_b = a, b
        expected[name] = alone
    slots = [0, adapters.get("one").slot, adapters.get("two").slot]
    with adapters.routing.rows(slots):
        out = model(x)
    assert mx.allclose(out[0], base(x[0]), atol=1e-5)
    assert mx.allclose(out[1], expected["one"](x[1]), atol=1e-5)
    assert mx.allclose(out[2], expected["two"](x[2]), atol=1e-5)
    adapters.remove("one")
    with adapters.routing.rows([slots[2], 0]):
        out = model(x[[2, 0]])
    assert mx.allclose(out[0], expected["two"](x[2]), atol=1e-5)
    assert mx.allclose(out[1], base(x[0]), atol=1e-5)
    assert model(x).shape == (3, 2, 4)  # outside a routed pass: the base


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("pirate=/a/b", LoraOption("pirate", Path("/a/b"), None)),
        ("pirate=/a/b@chat", LoraOption("pirate", Path("/a/b"), "chat")),
        ("p = /a/b @ chat ", LoraOption("p", Path("/a/b"), "chat")),
    ],
)
def test_lora_option(text, option):
    assert lora_option(text) == option


@pytest.mark.parametrize("text", ["pirate", "=/a/b", "pirate=", "pirate=@chat"])
def test_lora_option_refused(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="NAME=PATH"):
        lora_option(text)
