"""Server options that change how prompts are rendered or how the model is built."""

from __future__ import annotations

import json
import subprocess
import sys

import mlx.core as mx
from conversations import BY_NAME
from helpers.chat import chat
from helpers.speculation import DRAFT_ALWAYS
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.tuner.utils import linear_to_lora_layers

CHAT = "/v1/chat/completions"

PIRATE_TEMPLATE = (
    "<|im_start|>system\nYou are a pirate.<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{{ '<|im_start|>assistant\\n' }}"  # Jinja drops a bare trailing newline
)


def test_chat_template_from_a_file(launch, tiny_model, tmp_path):
    template = tmp_path / "pirate.jinja"
    template.write_text(PIRATE_TEMPLATE)
    srv = launch(tiny_model, "--chat-template", str(template))
    body = chat(srv, [{"role": "user", "content": "Hello!"}])
    assert body["choices"][0]["message"]["content"] == BY_NAME["system"].reply


def test_a_chat_template_path_that_names_no_file_stops_the_server(tiny_model, tmp_path):
    """A mistyped path used to become the template text (every prompt was the path)."""
    missing = str(tmp_path / "missing.jinja")
    command = [sys.executable, "-m", "mlxserve", "--model", str(tiny_model), "--port", "0"]
    done = subprocess.run(
        [*command, "--chat-template", missing], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert f"--chat-template {missing!r} is neither a file nor a template" in done.stderr


def test_a_chat_template_that_does_not_compile_stops_the_server(tiny_model, tmp_path):
    """It used to start and fail every chat with a 400."""
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}{{ message.content }}\n{% endfo %}")
    command = [sys.executable, "-m", "mlxserve", "--model", str(tiny_model), "--port", "0"]
    for value in (str(broken), "{{ messages[0].content }"):
        done = subprocess.run(
            [*command, "--chat-template", value], capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        assert "mlxserve: the chat template does not compile" in done.stderr, done.stderr
    assert "(line 2)" in done.stderr or "(line 1)" in done.stderr


def test_chat_template_args_and_request_kwargs(server, launch, tiny_model):
    messages = BY_NAME["capital"].messages
    plain = chat(server, messages)["usage"]["prompt_tokens"]
    per_request = chat(server, messages, chat_template_kwargs={"enable_thinking": False})
    srv = launch(tiny_model, "--chat-template-args", json.dumps({"enable_thinking": False}))
    server_wide = chat(srv, messages)
    # The template closes an empty think block when thinking is off.
    assert per_request["usage"]["prompt_tokens"] > plain
    assert server_wide["usage"]["prompt_tokens"] == per_request["usage"]["prompt_tokens"]
    overridden = chat(srv, messages, chat_template_kwargs={"enable_thinking": True})
    assert overridden["usage"]["prompt_tokens"] == plain


def test_draft_model(launch, tiny_model):
    flags = ("--num-draft-tokens", "2", *DRAFT_ALWAYS)
    srv = launch(tiny_model, "--draft-model", str(tiny_model), *flags)
    for name in ("capital", "story", "unicode"):
        conv = BY_NAME[name]
        body = chat(srv, conv.messages, max_tokens=400)
        assert body["choices"][0]["message"]["content"] == conv.reply
    again = chat(srv, BY_NAME["capital"].messages)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_adapter_path_changes_the_model(launch, tiny_model, tmp_path):
    model, _ = load(str(tiny_model))
    model.freeze()
    lora = {"rank": 4, "scale": 10.0, "dropout": 0.0}
    linear_to_lora_layers(model, 2, lora)
    mx.random.seed(0)
    adapters = {
        name: mx.random.normal(value.shape) * 0.5
        for name, value in tree_flatten(model.trainable_parameters())
    }
    mx.save_safetensors(str(tmp_path / "adapters.safetensors"), adapters)
    config = {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": lora}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    srv = launch(tiny_model, "--adapter-path", str(tmp_path))
    body = chat(srv, BY_NAME["capital"].messages, max_tokens=10)
    assert body["choices"][0]["message"]["content"] != BY_NAME["capital"].reply


def test_prompt_cache_byte_budget(server, launch, tiny_model):
    messages = BY_NAME["story"].messages
    chat(server, messages, max_tokens=5)
    unlimited = chat(server, messages, max_tokens=5)
    assert unlimited["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    srv = launch(tiny_model, "--prompt-cache-bytes", "1000", "--cache-limit-gb", "0.5")
    chat(srv, messages, max_tokens=5)
    again = chat(srv, messages, max_tokens=5)
    # No prefix fits in 1000 bytes: nothing is kept, nothing reused.
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert any("buffer cache limit 512.0 MB" in line for line in srv.log)
