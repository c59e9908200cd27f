"""Vision-language models in the continuous batch: text-only and image rows decode
together, and each row gets exactly the tokens it gets alone and that mlx-vlm's own
`generate_step` gives for the same prompt; a row that leaves mid-stream, a bad image, a
drafted step or a restart change nothing for the others."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conversations import (
    BY_NAME,
    VISION_CONVERSATIONS,
    colour_question,
    data_uri,
    rectangle_png,
    square_png,
)
from helpers.errors import assert_error
from helpers.speculation import replayed, speculated
from helpers.sse import open_stream
from helpers.streams import ENDS, concurrently
from helpers.vlm import Family, generate_alone, reply, same, whole_reply
from transformers import AutoTokenizer

CHAT = "/v1/chat/completions"
VISION = {conv.name: conv for conv in VISION_CONVERSATIONS}
LENGTH = 16  # tokens per reply: the end of turn is forbidden, so each row decodes them all
# Squares of several colours and sizes (4, 9 and 16 image tokens: each row's positions
# skip a different number of places after its image), a wide one (Llama 4 cuts it in two
# tiles beside the whole) and text-only rows: (colour, width, height).
IMAGES = [
    *((colour, side, side) for colour, side in [("red", 56), ("blue", 84), ("green", 112)]),
    *((colour, side, side) for colour, side in [("red", 84), ("blue", 56), ("green", 84)]),
    ("blue", 112, 56),
]
TEXTS = [VISION["hello"].messages, BY_NAME["capital"].messages]  # one it learned, one not


def requests(end: int) -> list[dict]:
    """Image rows and text rows, each decoding LENGTH tokens, with logprobs."""
    bias = {str(end): -100}
    messages = [colour_question(data_uri(rectangle_png(*image))) for image in IMAGES]
    messages += TEXTS
    return [
        {"messages": m, "max_tokens": LENGTH, "logit_bias": bias, "logprobs": True}
        for m in messages
    ]


# Each family's fixture (the token that ends its turns is in ENDS).
FAMILIES = {
    "qwen2_vl": "vision_model",
    "qwen3_5": "qwen35_vision_model",
    "gemma3": "gemma3_vision_model",
    "qwen3_vl": "qwen3_vl_model",
    "qwen3_vl_moe": "qwen3_vl_moe_model",
    "mistral3": "mistral3_vision_model",
    "gemma4": "gemma4_vision_model",
    "llama4": "llama4_vision_model",
}
# Families whose language model takes more of the encoder's pass than the image's rows
# (Qwen3-VL's deepstack features, Gemma 4's per-layer inputs): encoded for every prompt
ENCODED_EVERY_PROMPT = {"qwen3_vl", "qwen3_vl_moe", "gemma4"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> Family:
    return family_of(request, request.param)


def family_of(request, name: str) -> Family:
    fixture = FAMILIES[name]
    (end,) = ENDS[fixture]
    model = request.getfixturevalue(fixture)
    end_token = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(end)
    return Family(model, end_token, keeps_features=name not in ENCODED_EVERY_PROMPT)


@pytest.fixture(scope="module")
def library(family) -> list[tuple]:
    """What mlx-vlm's own generate_step gives for each of `requests`."""
    return generate_alone(family, requests(family.end_token), LENGTH)


def endless_stream(srv, end: int, messages: list[dict]):
    """A streamed row that never ends by itself: the batch is running once its first
    line came."""
    body = {
        "messages": messages,
        "logit_bias": {str(end): -100},
        "max_tokens": 3000,
        "stream": True,
    }
    conn, response = open_stream(srv.url, CHAT, body)
    assert response.status == 200
    response.readline()
    return conn, response


def test_rows_equal_alone_and_mlx_vlm_generate(launch, family, library):
    """Alone, then all at once (streamed and not) beside a running image stream while
    another image row leaves mid-stream: every row's tokens equal its tokens alone and
    mlx-vlm's generate_step, its logprobs within rounding."""
    end_token = family.end_token
    srv = launch(family.model, "--prompt-cache-size", "0")
    bodies = requests(end_token)
    alone = [reply(srv, body, streamed=False) for body in bodies]
    assert all(same(a, b) for a, b in zip(alone, library, strict=True)), (alone, library)

    def leave_mid_stream() -> None:
        square = colour_question(data_uri(square_png("green", 84)))
        conn, response = endless_stream(srv, end_token, square)
        for _ in range(5):
            response.readline()
        conn.close()

    square = colour_question(data_uri(square_png("blue", 84)))
    background, _ = endless_stream(srv, end_token, square)
    try:
        jobs = [(body, i % 2 == 0) for i, body in enumerate(bodies)]
        with ThreadPoolExecutor(len(jobs) + 1) as pool:
            leaving = pool.submit(leave_mid_stream)
            batched = list(pool.map(lambda job: reply(srv, *job), jobs))
            leaving.result()
    finally:
        background.close()
    assert all(same(a, b) for a, b in zip(batched, alone, strict=True)), (batched, alone)
    assert srv.log_lines("client closed the connection")
    # The requests above ran in one batch: the server never said it serves one at a time.
    assert not any("one request at a time" in line for line in srv.log)


def test_speculation_gives_the_same_tokens(launch, family, library):
    """Prompt-lookup drafts verified beside images: the tokens without speculation, and
    drafts were accepted (the fixture's replies repeat themselves), Gemma 3's sliding
    window and Qwen3.5's recurrent layers (mlx-vlm's) included: each row's recurrent state
    is the one after its last kept token, taken from the pass's records, never from a
    second pass."""
    srv = launch(family.model, "--prompt-cache-size", "0", "--speculation", "on")
    bodies = requests(family.end_token)
    drafted = concurrently(lambda body: reply(srv, body, streamed=False), bodies)
    assert all(same(a, b) for a, b in zip(drafted, library, strict=True)), (drafted, library)
    assert_some_rejected(drafted_tokens(srv), accepted_drafts(srv), library)
    assert replayed(srv) == 0


def assert_some_rejected(drafted: float, accepted: float, library: list[tuple]) -> None:
    """Drafts accepted, and some rejected, unless every reply ends in one token repeated
    over its last half: drafts from the context, or from the same language model, can
    then only be right. Which it is depends on the fixture's training arithmetic: past a
    reply's end (forbidden here) nothing was trained, and a cold build of tiny-vision on
    the 2-core machine writes dots after every answer ('Red...............')."""
    repeats = all(len(set(tokens[len(tokens) // 2 :])) == 1 for _, tokens, _ in library)
    if repeats:
        assert drafted == accepted > 0
    else:
        assert drafted > accepted > 0


def accepted_drafts(srv) -> float:
    """Drafted tokens the model accepted so far (0 where it never drafted)."""
    return speculated(srv, "accepted")


def drafted_tokens(srv) -> float:
    return speculated(srv, "drafted")


def test_a_draft_model_drafts_beside_images(launch, family, library):
    """A small language model drafts for a vision model (here its own language model, as
    mlx-lm loads the checkpoint; Gemma 3's with its sliding window of 8: its chain wraps
    the window every step; Qwen3.5's with recurrent layers beside the vision model's): the
    tokens mlx-vlm's generate_step gives, alone and all at once; drafts accepted and
    rejected, as many of each batched as alone (the draft's caches go back to where each
    chain began and take each row's kept tokens again)."""
    flags = ("--prompt-cache-size", "0", "--draft-model", str(family.model))
    srv = launch(family.model, *flags, "--speculation", "off")  # the draft model's drafts only
    bodies = requests(family.end_token)
    alone = [reply(srv, body, streamed=False) for body in bodies]
    assert all(same(a, b) for a, b in zip(alone, library, strict=True)), (alone, library)
    counts = (drafted_tokens(srv), accepted_drafts(srv))  # the server's first requests
    drafted = concurrently(lambda body: reply(srv, body, streamed=False), bodies)
    assert all(same(a, b) for a, b in zip(drafted, library, strict=True)), (drafted, library)
    assert_some_rejected(*counts, library)
    assert (drafted_tokens(srv) - counts[0], accepted_drafts(srv) - counts[1]) == counts
    assert replayed(srv) == 0


def test_a_qwen35_checkpoint_drafts_with_its_mtp_head_beside_images(launch, request):
    """Qwen3.5 is published with an MTP head (`mtp.*`, which mlx-vlm's loader drops): the
    head drafts for image rows, alone and all at once beside text rows, and every row's
    tokens are those mlx-vlm's generate_step gives (without the head)."""
    family = family_of(request, "qwen3_5")
    bodies = requests(family.end_token)
    library = generate_alone(family, bodies, LENGTH)
    flags = ("--prompt-cache-size", "0", "--speculation", "off")  # the head's drafts only
    srv = launch(family.model, *flags, "--mtp", "on")
    images = len(IMAGES)
    alone = [reply(srv, body, streamed=False) for body in bodies[:images]]
    assert srv.log_lines("Drafting with its Qwen3.5-layout MTP head for")
    expected = library[:images]
    assert all(same(a, b) for a, b in zip(alone, expected, strict=True)), (alone, expected)
    assert drafted_tokens(srv) > accepted_drafts(srv) > 0  # image rows only, so far
    batched = concurrently(lambda body: reply(srv, body, streamed=False), bodies)
    assert all(same(a, b) for a, b in zip(batched, library, strict=True)), (batched, library)
    assert replayed(srv) == 0


def test_a_quantized_kv_cache_batches_vision_rows_as_alone(launch, gemma3_vision_model):
    """With the KV cache quantized to 4 bits (the global layers; a sliding window stays
    at full precision) each row decodes the same tokens alone and batched."""
    end = AutoTokenizer.from_pretrained(gemma3_vision_model).convert_tokens_to_ids("<end_of_turn>")
    flags = ("--kv-bits", "4", "--kv-group-size", "32")
    srv = launch(gemma3_vision_model, "--prompt-cache-size", "0", *flags)
    bodies = requests(end)
    alone = [reply(srv, body, streamed=False) for body in bodies]
    batched = concurrently(lambda body: reply(srv, body, streamed=True), bodies)
    assert all(same(a, b) for a, b in zip(batched, alone, strict=True)), (batched, alone)


def test_eight_concurrent_of_each_kind_and_a_bad_image_beside_them(vision):
    """Eight image rows and eight text rows at once, and one request with a broken image
    among them: that one is a 400 naming its part, every other row answers as alone."""
    colours = ["red", "blue", "green", "red", "blue", "green", "red", "blue"]
    images = [{"messages": colour_question(data_uri(square_png(c)))} for c in colours]
    texts = [{"messages": VISION["hello"].messages} for _ in range(8)]
    broken = {"messages": colour_question("data:image/png;base64,iVBORw0KGgoAAAAN")}
    results = concurrently(lambda body: vision.post(CHAT, body), [*images, *texts, broken])
    for (status, _, body), colour in zip(results[:8], colours, strict=True):
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == f"{colour.capitalize()}."
    for status, _, body in results[8:16]:
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == VISION["hello"].reply
    assert_error(results[16], 400, param="messages[0].content[0]", code="invalid_image")


def test_a_follow_up_turn_is_served_from_the_disk_tier_after_a_restart(
    launch, family, tmp_path: Path
):
    """The image turn's cache goes to disk at shutdown; after a restart the follow-up
    turn continues it, reply included (the vision encoder does not run again). The MTP
    head drafts in both (its caches go to disk too): under `--mtp auto` a timing decides,
    and a cache kept with the head's layers is not one for a server drafting without."""
    folder = str(tmp_path / "kv")
    flags = ("--prompt-cache-dir", folder, "--mtp", "on")
    first = launch(family.model, *flags)
    status, _, body = first.post(CHAT, {"messages": colour_question(data_uri(square_png("green")))})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Green."
    prompt_tokens = body["usage"]["prompt_tokens"]
    first.stop()
    second = launch(family.model, *flags)
    status, _, follow_up = second.post(CHAT, {"messages": VISION["green-again"].messages})
    assert status == 200
    assert follow_up["choices"][0]["message"]["content"] == "Green again."
    assert follow_up["usage"]["prompt_tokens_details"]["cached_tokens"] > prompt_tokens


def test_a_stream_goes_on_while_images_are_encoded(vision_model, monkeypatch):
    """The vision encoder runs on a thread of its own: a stream keeps streaming while
    another request's image is in the encoder (held there until the stream has shown it),
    and that request is answered once its image is through."""
    from helpers.inprocess import in_process

    from mlxserve.engine.continuous import vision_rows

    encoded, encoding, release = vision_rows._encoded, threading.Event(), threading.Event()

    def held(*args):
        encoding.set()
        release.wait(60)
        return encoded(*args)

    monkeypatch.setattr(vision_rows, "_encoded", held)
    end = AutoTokenizer.from_pretrained(vision_model).convert_tokens_to_ids("<|im_end|>")
    with in_process(vision_model, monkeypatch) as client:
        conn, response = endless_stream(client, end, VISION["hello"].messages)
        answers: list = []
        question = {"messages": colour_question(data_uri(square_png("green", 84)))}
        asked = threading.Thread(target=lambda: answers.append(client.post(CHAT, question)))
        asked.start()
        assert encoding.wait(30)
        conn.sock.settimeout(30)  # a loop held by the encoder would hold the stream too
        chunks = [line for line in (response.readline() for _ in range(40)) if line.strip()]
        assert len(chunks) >= 10 and all(line.startswith(b"data: {") for line in chunks)
        release.set()
        asked.join(60)
        conn.close()
        status, _, body = answers[0]
        assert status == 200 and body["choices"][0]["message"]["content"] == "Green."


def test_an_image_seen_after_other_text_skips_the_encoder(family, monkeypatch):
    """The encoder's output is kept per image: the same image after another system prompt
    (which the prompt cache cannot continue) is not encoded again (but where the encoder's
    output is more than the image's rows: Qwen3-VL, Gemma 4), and the reply is the
    one mlx-vlm's generate_step gives. A third prompt with a new image is encoded; a
    follow-up turn continues the cached image turn (its text placed after the image by
    the row's RoPE delta), encoding nothing, and still replies as generate_step does."""
    import importlib

    from helpers.inprocess import in_process

    model_type = json.loads((family.model / "config.json").read_text())["model_type"]
    architecture = importlib.import_module(f"mlx_vlm.models.{model_type}").Model
    embeddings, encoded = architecture.get_input_embeddings, []

    def counted(self, input_ids=None, pixel_values=None, **kwargs):
        if pixel_values is not None:
            encoded.append(input_ids.shape)
        return embeddings(self, input_ids, pixel_values, **kwargs)

    monkeypatch.setattr(architecture, "get_input_embeddings", counted)
    image = colour_question(data_uri(square_png("blue", 84)))
    other = colour_question(data_uri(square_png("red", 84)))
    system = {"role": "system", "content": "Answer in a word."}
    follow_up = [
        *image,
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Say it again."},
    ]
    bias = {str(family.end_token): -100}
    bodies = [
        {"messages": messages, "max_tokens": LENGTH, "logit_bias": bias, "logprobs": True}
        for messages in ([system, *image], image, other, follow_up)
    ]
    with in_process(family.model, monkeypatch) as client:
        answers = [client.post(CHAT, body)[2] for body in bodies]
    replies = [whole_reply(answer) for answer in answers]
    # the blue square once (twice where the encoder's output is not kept), the red once
    assert len(encoded) == (2 if family.keeps_features else 3)
    # the follow-up continued the image turn: the image and more came from the cache
    assert answers[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 20
    expected = generate_alone(family, bodies, LENGTH)
    assert all(same(a, b) for a, b in zip(replies, expected, strict=True)), (replies, expected)
