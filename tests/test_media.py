"""Video and audio in the conversation: a Qwen2.5-VL model reading clips and Gemma 4 and
Gemma 3n models hearing tones, through the dialects that spell them (Chat's `video_url`,
`input_audio` and `file` parts, Responses' `input_audio` and `input_file`), in the
continuous batch (batched == alone == mlx-vlm's own generate_step), in the prompt cache
(its disk tier included), and every limit a 400 naming the part."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from conversations import (
    AUDIO_CONVERSATIONS,
    VIDEO_CONVERSATIONS,
    audio_part,
    audio_question,
    colour_clip,
    data_uri,
    image_part,
    square_png,
    tone_wav,
    video_part,
    video_question,
    video_reply,
)
from helpers.errors import assert_error
from helpers.vlm import Family, generate_alone, reply, same
from transformers import AutoTokenizer

CHAT = "/v1/chat/completions"
LENGTH = 16  # tokens per reply: the end of turn is forbidden, so each row decodes them all
VIDEO = {conv.name: conv for conv in VIDEO_CONVERSATIONS}
AUDIO = {conv.name: conv for conv in AUDIO_CONVERSATIONS}


@dataclass(frozen=True)
class Medium:
    fixture: str  # the model's fixture
    end: str  # the token that ends its turns
    rows: list[list[dict]]  # conversations holding a clip, of several lengths
    hello: list[dict]  # a text-only conversation


# Tones of both pitches, of two lengths (other numbers of audio tokens)
AUDIO_ROWS = [
    audio_question("low"),
    audio_question("high", 2.0),
    audio_question("low", 2.0),
    audio_question("high"),
]
MEDIA = {
    "video": Medium(
        "qwen25_vl_model",
        "<|im_end|>",
        [
            video_question("red", "blue"),
            video_question("green", "green", 4.0),
            video_question("blue", "red", 4.0),
            video_question("green", "red"),
        ],
        VIDEO["hello"].messages,
    ),
    "audio": Medium(
        "gemma4_audio_model",
        "<end_of_turn>",
        AUDIO_ROWS,
        AUDIO["hello"].messages,
    ),
    "gemma3n": Medium(
        "gemma3n_audio_model",
        "<end_of_turn>",
        AUDIO_ROWS,
        AUDIO["hello"].messages,
    ),
}


@pytest.fixture(scope="module", params=list(MEDIA))
def medium(request) -> tuple[Medium, Family]:
    medium = MEDIA[request.param]
    model = request.getfixturevalue(medium.fixture)
    end_token = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(medium.end)
    return medium, Family(model, end_token)


def bodies(medium: Medium, end_token: int) -> list[dict]:
    """Clip rows and a text row, each decoding LENGTH tokens, with logprobs."""
    bias = {str(end_token): -100}
    return [
        {"messages": m, "max_tokens": LENGTH, "logit_bias": bias, "logprobs": True}
        for m in [*medium.rows, medium.hello]
    ]


def test_rows_equal_alone_and_mlx_vlm_generate(launch_module, medium):
    """Each clip row alone gives mlx-vlm's generate_step's tokens (logprobs within
    rounding); all at once, streamed and not, beside the text row, the same again."""
    given, family = medium
    srv = launch_module(family.model, "--prompt-cache-size", "0")
    rows = bodies(given, family.end_token)
    library = generate_alone(family, rows, LENGTH)
    alone = [reply(srv, body, streamed=False) for body in rows]
    assert all(same(a, b) for a, b in zip(alone, library, strict=True)), (alone, library)
    jobs = [(body, i % 2 == 0) for i, body in enumerate(rows * 2)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        batched = list(pool.map(lambda job: reply(srv, *job), jobs))
    assert all(same(a, b) for a, b in zip(batched, alone * 2, strict=True)), (batched, alone)
    assert not any("one request at a time" in line for line in srv.log)


def test_the_openai_sdk_streamed_and_not(launch_module, medium):
    """The `openai` SDK as it ships: each clip's trained answer, streamed and not, and
    `usage.prompt_tokens` counts the clip's tokens."""
    given, family = medium
    srv = launch_module(family.model)
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused")
    conversations = (
        VIDEO_CONVERSATIONS if given.fixture == "qwen25_vl_model" else AUDIO_CONVERSATIONS
    )
    for conv in conversations[:4]:
        whole = client.chat.completions.create(model="default", messages=conv.messages)  # type: ignore[arg-type]
        assert whole.choices[0].message.content == conv.reply
        assert whole.usage is not None and whole.usage.prompt_tokens > 20
        chunks = client.chat.completions.create(
            model="default",
            messages=conv.messages,  # type: ignore[arg-type]
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == conv.reply


def test_a_follow_up_turn_continues_from_the_disk_tier_after_a_restart(launch, medium, tmp_path):
    """The clip's turn goes to disk at shutdown; after a restart the follow-up turn
    continues it, the clip's tokens included, and answers about the clip."""
    given, family = medium
    again = VIDEO["red-blue-again"] if given.fixture == "qwen25_vl_model" else AUDIO["low-again"]
    first_turn = again.messages[:1]
    flags = ("--prompt-cache-dir", str(tmp_path / "kv"))
    first = launch(family.model, *flags)
    status, _, body = first.post(CHAT, {"messages": first_turn})
    assert (
        status == 200 and body["choices"][0]["message"]["content"] == again.messages[1]["content"]
    )
    prompt_tokens = body["usage"]["prompt_tokens"]
    first.stop()
    second = launch(family.model, *flags)
    status, _, follow_up = second.post(CHAT, {"messages": again.messages})
    assert status == 200, follow_up
    assert follow_up["choices"][0]["message"]["content"] == again.reply
    assert follow_up["usage"]["prompt_tokens_details"]["cached_tokens"] > prompt_tokens


def test_the_same_clip_at_another_rate_is_not_taken_from_the_cache(launch_module, qwen25_vl_model):
    """A clip's frames sampled at another rate are other frames: the prompt cache keys the
    clip by its bytes and its frames' times, so nothing past the text before it is reused;
    vLLM's `mm_processor_kwargs.fps` sets the rate of parts that name none."""
    srv = launch_module(qwen25_vl_model)
    clip = video_part(colour_clip("red", "blue", 4.0))
    slow = {**clip, "video_url": {**clip["video_url"], "fps": 1.0}}
    question = {"type": "text", "text": "What colours does the video show?"}
    first = srv.post(CHAT, {"messages": [{"role": "user", "content": [clip, question]}]})[2]
    again = srv.post(CHAT, {"messages": [{"role": "user", "content": [clip, question]}]})[2]
    other = srv.post(CHAT, {"messages": [{"role": "user", "content": [slow, question]}]})[2]
    assert (
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= first["usage"]["prompt_tokens"] - 1
    )
    assert other["usage"]["prompt_tokens"] < first["usage"]["prompt_tokens"]  # fewer frames
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] <= 5  # the text before it
    # vLLM's request-wide rate: the same frames as the part's own rate, so from the cache
    asked = {"messages": [{"role": "user", "content": [clip, question]}]}
    vllm = srv.post(CHAT, {**asked, "mm_processor_kwargs": {"fps": 1.0}})[2]
    assert vllm["usage"]["prompt_tokens"] == other["usage"]["prompt_tokens"]
    assert (
        vllm["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= other["usage"]["prompt_tokens"] - 1
    )
    refused = srv.post(CHAT, {**asked, "mm_processor_kwargs": {"fps": "fast"}})
    assert_error(refused, 400, param="mm_processor_kwargs.fps")


def test_models_list_their_input_modalities(
    launch_module, qwen25_vl_model, gemma4_audio_model, gemma3n_audio_model, server
):
    """/v1/models says which media each model takes."""
    for model, expected in [
        (qwen25_vl_model, ["text", "image", "video"]),
        (gemma4_audio_model, ["text", "image", "audio"]),
        (gemma3n_audio_model, ["text", "image", "audio"]),
    ]:
        status, _, body = launch_module(model).get("/v1/models")
        assert status == 200 and body["data"][0]["input_modalities"] == expected
    assert server.get("/v1/models")[2]["data"][0]["input_modalities"] == ["text"]


def test_responses_input_audio_and_an_input_file_clip(
    launch_module, qwen25_vl_model, gemma4_audio_model
):
    """The Responses API: an `input_audio` part, and a video as an `input_file` (inline
    file_data, as the SDK sends a file it read)."""
    audio = launch_module(gemma4_audio_model)
    wav = base64.b64encode(tone_wav("high")).decode()
    status, _, body = audio.post(
        "/v1/responses",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                        {"type": "input_text", "text": "What do you hear?"},
                    ],
                }
            ]
        },
    )
    assert status == 200, body
    assert body["output"][-1]["content"][0]["text"] == "A high tone."
    video = launch_module(qwen25_vl_model)
    clip = base64.b64encode(colour_clip("blue", "green")).decode()
    status, _, body = video.post(
        "/v1/responses",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_file", "filename": "clip.mp4", "file_data": clip},
                        {"type": "input_text", "text": "What colours does the video show?"},
                    ],
                }
            ]
        },
    )
    assert status == 200, body
    assert body["output"][-1]["content"][0]["text"] == video_reply("blue", "green")


def test_a_chat_file_part_and_a_local_clip(launch, qwen25_vl_model, tmp_path: Path):
    """Chat's `file` part with a video's data URL, and a clip named by its path inside an
    --image-dir folder (outside it: a 400)."""
    (tmp_path / "clip.mp4").write_bytes(colour_clip("green", "blue"))
    srv = launch(qwen25_vl_model, "--image-dir", str(tmp_path))
    clip = base64.b64encode(colour_clip("red", "green")).decode()
    question = {"type": "text", "text": "What colours does the video show?"}
    as_file = {"type": "file", "file": {"file_data": f"data:video/mp4;base64,{clip}"}}
    body = srv.post(CHAT, {"messages": [{"role": "user", "content": [as_file, question]}]})[2]
    assert body["choices"][0]["message"]["content"] == video_reply("red", "green")
    local = {"type": "video_url", "video_url": {"url": str(tmp_path / "clip.mp4")}}
    body = srv.post(CHAT, {"messages": [{"role": "user", "content": [local, question]}]})[2]
    assert body["choices"][0]["message"]["content"] == video_reply("green", "blue")
    outside = {"type": "video_url", "video_url": {"url": "/etc/hostname"}}
    refused = srv.post(CHAT, {"messages": [{"role": "user", "content": [outside, question]}]})
    assert_error(refused, 400, param="messages[0].content[0]", code="video_path_not_allowed")


def _ask(*parts: dict) -> dict:
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What?"}]}]}


def test_every_limit_is_a_400_naming_the_part(launch, qwen25_vl_model, gemma4_audio_model, server):
    """Media a model does not take, media that is not what it says, clips over the
    limits, a rate over the limit, images beside a video where the family takes one of
    the two: each a 400 naming the part, and the server goes on answering."""
    video = launch(qwen25_vl_model, "--max-video-seconds", "3", "--max-video-bytes", "6000")
    audio = launch(gemma4_audio_model, "--max-audio-seconds", "1.5")
    clip = video_part(colour_clip("red", "blue"))
    tone = audio_part(tone_wav("low"))
    where = "messages[0].content[0]"
    cases = [
        (video, _ask(tone), where, "audio_not_supported"),
        (audio, _ask(clip), where, "video_not_supported"),
        (server, _ask(clip), where, "video_not_supported"),
        (server, _ask(tone), where, "audio_not_supported"),
        (
            video,
            _ask({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}),
            where,
            "invalid_video",
        ),
        (
            video,
            _ask({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,@@"}}),
            where,
            "invalid_video",
        ),
        (video, _ask(video_part(colour_clip("red", "blue", 4.0))), where, "video_too_long"),
        (video, _ask(video_part(b"\0" * 6001)), where, "video_too_large"),
        (
            video,
            _ask({"type": "video_url", "video_url": {**clip["video_url"], "fps": 9}}),
            where,
            "invalid_video",
        ),
        (
            video,
            _ask(image_part(data_uri(square_png("red"))), clip),
            "messages[0].content[1]",
            "mixed_media_not_supported",
        ),
        (audio, _ask(audio_part(tone_wav("low", 2.0))), where, "audio_too_long"),
        (
            audio,
            _ask({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
            where,
            "invalid_audio",
        ),
    ]
    for srv, body, param, code in cases:
        assert_error(srv.post(CHAT, body), 400, param=param, code=code)
    in_reply = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": [clip]},
        {"role": "user", "content": "What?"},
    ]
    assert_error(video.post(CHAT, {"messages": in_reply}), 400, param="messages[1].content[0]")
    status, _, body = video.post(CHAT, {"messages": VIDEO["red-red-2.0s"].messages})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Red."


def test_anthropic_names_the_block_it_has_no_audio_or_video_for(launch_module, gemma4_audio_model):
    """Anthropic's Messages API has no audio or video block: one is a 400 in Anthropic's
    error shape naming the block."""
    srv = launch_module(gemma4_audio_model)
    wav = base64.b64encode(tone_wav("low")).decode()
    for block in (
        {"type": "audio", "source": {"type": "base64", "media_type": "audio/wav", "data": wav}},
        {"type": "video", "source": {"type": "base64", "media_type": "video/mp4", "data": wav}},
    ):
        status, _, body = srv.post(
            "/v1/messages",
            {
                "model": "default",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [block]}],
            },
        )
        assert status == 400, body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
        assert f"'messages[0].content': block 0 is of type '{block['type']}'" in message, body


@pytest.mark.parametrize("fixture", ["gemma4_audio_model", "gemma3n_audio_model"])
def test_audio_clips_of_several_lengths_each_reach_their_own_placeholders(request, fixture):
    """Each clip's rows in a prompt of two equal its rows in a prompt of its own. mlx-vlm's
    Gemma 4 handed a prompt's audio placeholders the tower's frames in order, padding
    included: a short clip before a long one gave the long one's placeholders the short
    one's padding (mended: vision_mends.PackedAudioTower). Gemma 3n's feature extractor
    marked two frames of a short clip's padding valid beside a longer clip, so its last
    audio token changed (mended: vision_mends.ClipsAlone)."""
    import mlx.core as mx
    from mlx_vlm.utils import load_model

    from mlxserve.api.openai.requests import ChatRequest, chat_request
    from mlxserve.api.wire import validate
    from mlxserve.chat.media import MediaLimits
    from mlxserve.chat.vision_prompt import VisionChat, render_vision_chat
    from mlxserve.config import ServerConfig
    from mlxserve.models.tokenizer import load_text_tokenizer
    from mlxserve.models.vision_loader import load_vision_processor
    from mlxserve.models.vision_mends import mend

    path = request.getfixturevalue(fixture)
    model = load_model(path)
    mend(model)
    chat = VisionChat(
        load_text_tokenizer(path, False),
        load_vision_processor(path, False),
        path,
        MediaLimits.from_config(ServerConfig()),
    )

    def clip_rows(*clips: bytes) -> list[mx.array]:
        content = [audio_part(clip) for clip in clips]
        request = chat_request(
            validate(ChatRequest, {"messages": [{"role": "user", "content": content}]})
        )
        prompt, media = render_vision_chat(chat, request, {}, None, False)
        tokens = mx.array(prompt)[None]
        embeds = model.get_input_embeddings(tokens, None, **media.extra).inputs_embeds
        return [embeds[0, start:end] for start, end in media.spans]

    short, long = tone_wav("low", 0.5), tone_wav("high", 2.0)
    together = clip_rows(short, long)
    alone = [clip_rows(short)[0], clip_rows(long)[0]]
    for both, own in zip(together, alone, strict=True):
        assert both.shape == own.shape
        assert mx.allclose(both, own, atol=1e-4).item()
