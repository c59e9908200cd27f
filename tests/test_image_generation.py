"""/v1/images/generations and /v1/images/edits on tiny-z-image (Z-Image's pipeline, random
weights) beside tiny-chat: images equal mlx-vlm's own pipeline byte for byte, the SDK's
calls end to end, streamed partial images, masked edits, the 4xx cases, a client that
leaves, a chat stream that keeps decoding between a render's steps, and the kind's
residency."""

from __future__ import annotations

import base64
import http.client
import io
import json
import shutil
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from helpers.server import start_server
from helpers.sse import open_stream
from helpers.streams import TimedStream, endless
from PIL import Image

from mlxserve.images.render import ImageModel
from mlxserve.keys.records import KeyRecord
from mlxserve.keys.store import KeyStore

GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"


@pytest.fixture(scope="module")
def server(tiny_model, z_image_model):
    srv = start_server(tiny_model, "--model", str(z_image_model))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none")


@pytest.fixture(scope="module")
def library(z_image_model):
    """mlx-vlm's own Z-Image pipeline, in this process."""
    return ImageModel.load(z_image_model).pipeline


def png(array) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.array(array)).save(buffer, format="PNG")
    return buffer.getvalue()


def decoded(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def source_image(width: int = 128, height: int = 96) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return png(pixels)


def half_mask(width: int = 128, height: int = 96) -> bytes:
    """Opaque but for the left half, fully transparent: redraw the left half."""
    alpha = np.full((height, width), 255, dtype=np.uint8)
    alpha[:, : width // 2] = 0
    rgba = np.dstack([np.zeros((height, width, 3), dtype=np.uint8), alpha])
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG")
    return buffer.getvalue()


def upload(server, fields: dict, files: list[tuple[str, bytes]]):
    """A multipart POST to /v1/images/edits: (status, parsed JSON body)."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    for name, data in files:
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="f.png"\r\n'
            "Content-Type: image/png\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    request = urllib.request.Request(server.url + EDITS, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def events(server, path: str, body: dict) -> list[tuple[str, dict]]:
    conn, response = open_stream(server.url, path, body)
    assert response.status == 200
    found, name = [], None
    while line := response.readline():
        text = line.decode().strip()
        if text.startswith("event: "):
            name = text[7:]
        elif text.startswith("data: "):
            found.append((name, json.loads(text[6:])))
    conn.close()
    return found


def test_the_sdk_generates_the_librarys_images(client, library, z_image_model):
    """n images: image i is the library's render with seed + i, the same PNG bytes; the
    same request again gives the same bytes."""
    args = dict(model=str(z_image_model), prompt="a red square", size="128x64", n=2)
    reply = client.images.generate(**args, extra_body={"seed": 11, "steps": 4})
    again = client.images.generate(**args, extra_body={"seed": 11, "steps": 4})
    assert [d.b64_json for d in reply.data] == [d.b64_json for d in again.data]
    for i, item in enumerate(reply.data):
        expected = library.generate_array(
            "a red square", seed=11 + i, steps=4, width=128, height=64
        )
        assert base64.b64decode(item.b64_json) == png(expected)
    assert (reply.size, reply.quality, reply.output_format, reply.background) == (
        "128x64",
        "medium",
        "png",
        "opaque",
    )
    prompt_tokens = library.count_prompt_tokens("a red square")
    usage = reply.usage
    assert usage.input_tokens == usage.input_tokens_details.text_tokens == prompt_tokens
    assert usage.output_tokens == 2 * (128 // 16) * (64 // 16)
    assert usage.total_tokens == prompt_tokens + usage.output_tokens


def test_the_default_model_and_steps_are_the_image_models(client, library):
    """No model named: the server's image model; no steps: the model's default (9)."""
    reply = client.images.generate(prompt="a cat", size="64x64", extra_body={"seed": 2})
    expected = library.generate_array("a cat", seed=2, steps=9, width=64, height=64)
    assert base64.b64decode(reply.data[0].b64_json) == png(expected)


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_other_formats_and_their_compression(client, fmt):
    args = dict(
        prompt="a boat", size="128x64", output_format=fmt, extra_body={"seed": 4, "steps": 3}
    )
    best = client.images.generate(**args)
    small = client.images.generate(**args, output_compression=10)
    image = decoded(best.data[0].b64_json)
    assert image.format == fmt.upper() and image.size == (128, 64)
    assert best.output_format == fmt
    assert len(base64.b64decode(small.data[0].b64_json)) < len(
        base64.b64decode(best.data[0].b64_json)
    )


def test_url_links_serve_the_image_without_a_key(client, server):
    reply = client.images.generate(
        prompt="a boat", size="64x64", response_format="url", extra_body={"seed": 4, "steps": 3}
    )
    url = reply.data[0].url
    assert url.startswith(server.url + "/v1/images/files/") and url.endswith(".png")
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Type"] == "image/png"
        data = response.read()
    b64 = client.images.generate(prompt="a boat", size="64x64", extra_body={"seed": 4, "steps": 3})
    assert data == base64.b64decode(b64.data[0].b64_json)
    status, _, body = server.get("/v1/images/files/nothing-here.png")
    assert status == 404 and body["error"]["code"] == "image_not_found"


def test_a_stream_sends_partial_images_then_the_image(server, client, library):
    """partial_images: 2 -> two partial_image events (indices 0 and 1), then completed,
    whose image is the unstreamed one's; the SDK reads the same events."""
    body = {"prompt": "a tree", "size": "128x64", "seed": 5, "steps": 6}
    found = events(server, GENERATIONS, {**body, "stream": True, "partial_images": 2})
    names = [name for name, _ in found]
    assert names == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [data["type"] for _, data in found] == names
    assert [data.get("partial_image_index") for _, data in found] == [0, 1, None]
    for _, data in found:
        assert decoded(data["b64_json"]).size == (128, 64)
        assert {data["size"], data["output_format"], data["quality"]} == {"128x64", "png", "medium"}
    expected = library.generate_array("a tree", seed=5, steps=6, width=128, height=64)
    assert base64.b64decode(found[-1][1]["b64_json"]) == png(expected)
    assert found[-1][1]["usage"]["output_tokens"] == 32
    partials = [base64.b64decode(data["b64_json"]) for _, data in found[:2]]
    assert partials[0] != partials[1] != png(expected)
    stream = client.images.generate(
        prompt="a tree",
        size="128x64",
        stream=True,
        partial_images=1,
        extra_body={"seed": 5, "steps": 6},
    )
    types = [event.type for event in stream]
    assert types == ["image_generation.partial_image", "image_generation.completed"]


def test_an_edit_is_the_librarys_img2img(client, library, tmp_path):
    source = source_image()
    path = tmp_path / "source.png"
    path.write_bytes(source)
    reply = client.images.edit(
        image=("source.png", source, "image/png"), prompt="blue", extra_body={"seed": 6}
    )
    expected = library.edit_array("blue", [path], seed=6, steps=8, strength=0.6)
    assert base64.b64decode(reply.data[0].b64_json) == png(expected)
    assert reply.size == "128x96"
    tokens = (128 // 16) * (96 // 16)
    assert reply.usage.input_tokens_details.image_tokens == tokens
    assert reply.usage.output_tokens == tokens


def test_a_masked_edit_redraws_only_the_transparent_part(client):
    source = source_image()
    reply = client.images.edit(
        image=[("source.png", source, "image/png")],
        mask=("mask.png", half_mask(), "image/png"),
        prompt="blue",
        extra_body={"seed": 6},
    )
    edited = np.asarray(decoded(reply.data[0].b64_json))
    original = np.asarray(Image.open(io.BytesIO(source)))
    assert np.array_equal(edited[:, 64:], original[:, 64:])
    assert (edited[:, :64] != original[:, :64]).mean() > 0.9


def test_a_streamed_edit_has_the_edit_events(server, client):
    stream = client.images.edit(
        image=("source.png", source_image(), "image/png"),
        prompt="blue",
        stream=True,
        partial_images=1,
        extra_body={"seed": 6},
    )
    assert [event.type for event in stream] == ["image_edit.partial_image", "image_edit.completed"]


@pytest.mark.parametrize(
    "bad, param",
    [
        ({"size": "100x100"}, "size"),
        ({"size": "4096x64"}, "size"),
        ({"size": "big"}, "size"),
        ({"n": 11}, "n"),
        ({"n": 0}, "n"),
        ({"steps": 0}, "steps"),
        ({"steps": 101}, "steps"),
        ({"steps": 1}, "steps"),
        ({"partial_images": 2}, "partial_images"),
        ({"stream": True, "partial_images": 4}, "partial_images"),
        ({"stream": True, "response_format": "url"}, "response_format"),
        ({"background": "transparent"}, "background"),
        ({"output_format": "gif"}, "output_format"),
        ({"output_compression": 101}, "output_compression"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_generations_are_400s_that_name_the_field(server, bad, param):
    body = {"prompt": "a cat", "size": "64x64", "steps": 2, **bad}
    status, _, reply = server.post(GENERATIONS, body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"


def test_a_chat_model_does_not_draw(server, tiny_model):
    status, _, reply = server.post(GENERATIONS, {"model": str(tiny_model), "prompt": "a cat"})
    assert status == 400 and reply["error"]["code"] == "model_not_image"


def test_bad_edits_are_400s_that_name_the_field(server):
    image, fields = source_image(), {"prompt": "blue", "steps": "2"}
    cases = [
        (fields, [], "image"),
        (fields, [("image[]", image), ("image[]", image)], "image"),
        (fields, [("image", b"not an image")], "image"),
        (fields, [("image", image[: len(image) // 2])], "image"),
        (fields, [("image", image), ("mask", image)], "mask"),  # no alpha
        (fields, [("image", image), ("mask", half_mask(64, 64))], "mask"),  # another size
        ({**fields, "strength": "2"}, [("image", image)], "strength"),
        ({**fields, "n": "many"}, [("image", image)], "n"),
        ({"prompt": ""}, [("image", image)], "prompt"),
        (fields, [("image", png(np.zeros((32, 32, 3), dtype=np.uint8)))], "image"),
    ]
    for form_fields, files, param in cases:
        status, reply = upload(server, form_fields, files)
        assert status == 400 and reply["error"]["param"] == param, (param, reply)
    status, _, reply = server.post(EDITS, {"prompt": "blue"})
    assert status == 400 and "multipart/form-data" in reply["error"]["message"]


def test_a_client_that_leaves_stops_the_render(server, client):
    """The client hangs up after the first partial image: the render stops at its next
    step, one log line says so, and the next request is served."""
    body = {"prompt": "a tree", "size": "256x256", "seed": 5, "steps": 60, "stream": True}
    conn, response = open_stream(server.url, GENERATIONS, {**body, "partial_images": 3})
    while not response.readline().startswith(b"data: "):
        pass
    started = time.monotonic()
    conn.close()
    assert server.log_lines("client closed the connection: POST /v1/images/generations")
    reply = client.images.generate(prompt="a cat", size="64x64", extra_body={"seed": 1, "steps": 2})
    assert len(reply.data) == 1
    assert time.monotonic() - started < 60
    assert not [line for line in server.log if "Traceback" in line or "unhandled" in line]


def test_a_chat_stream_decodes_between_the_renders_steps(server, tiny_model):
    """While an image renders, the chat stream beside it gets tokens between its steps
    (as it does between a long prompt's chunks), not only before and after."""
    steps = 30
    running = TimedStream(server, endless(tiny_model, max_tokens=4000))
    try:
        while len(running.data_times()) < 3:
            time.sleep(0.01)
        sent = time.monotonic()
        status, _, reply = server.post(
            GENERATIONS, {"prompt": "a tree", "size": "256x256", "seed": 5, "steps": steps}
        )
        done = time.monotonic()
        during = [t for t in running.data_times() if sent < t < done]
    finally:
        running.close()
    assert status == 200, reply
    assert len(during) >= steps - 3


def test_models_lists_the_image_kind_and_it_unloads_and_loads(server, client, z_image_model):
    name = str(z_image_model)
    _, _, reply = server.get("/v1/models")
    entry = next(m for m in reply["data"] if m["id"] == name)
    assert entry["kind"] == "image" and entry["state"] == "loaded"
    weights = sum(f.stat().st_size for f in z_image_model.glob("*/*.safetensors"))
    assert entry["size_bytes"] == weights > 0
    status, _, reply = server.post("/v1/models/unload", {"model": name})
    assert status == 200 and reply["state"] == "not-loaded", reply
    first = client.images.generate(
        model=name, prompt="a cat", size="64x64", extra_body={"seed": 1, "steps": 2}
    )
    status, _, reply = server.post("/v1/models/load", {"model": name})
    assert status == 200 and reply["state"] == "loaded", reply
    again = client.images.generate(
        model=name, prompt="a cat", size="64x64", extra_body={"seed": 1, "steps": 2}
    )
    assert first.data[0].b64_json == again.data[0].b64_json


def test_a_folder_of_another_image_family_is_refused_at_load(
    launch, tmp_path, tiny_model, z_image_model
):
    """A pipeline mlx-vlm knows but mlxserve does not render (FLUX.2): a 400 that says
    which families are served, not a crash."""
    folder = tmp_path / "flux"
    folder.mkdir()
    index = json.loads((z_image_model / "model_index.json").read_text())
    index["_class_name"] = "Flux2KleinPipeline"
    index["transformer"] = ["diffusers", "Flux2Transformer2DModel"]
    (folder / "model_index.json").write_text(json.dumps(index))
    for part in ("transformer", "text_encoder", "vae", "tokenizer"):
        (folder / part).symlink_to(z_image_model / part)
    shutil.copytree(z_image_model, tmp_path / "zimage")  # a link out of --model-dir is not listed
    srv = launch(tiny_model, "--model-dir", str(tmp_path))
    _, _, listed = srv.get("/v1/models")
    kinds = {m["id"]: m["kind"] for m in listed["data"]}
    assert kinds["flux"] == kinds["zimage"] == "image"
    assert not [name for name in kinds if name.startswith(("flux/", "zimage/"))]  # components
    status, _, reply = srv.post(GENERATIONS, {"model": "flux", "prompt": "a cat"})
    assert status == 400, reply
    assert reply["error"]["code"] == "model_load_failed" and "z_image" in reply["error"]["message"]
    body = {"model": "zimage", "prompt": "a cat", "size": "64x64", "steps": 2}
    assert srv.post(GENERATIONS, body)[0] == 200


def test_the_connection_stays_usable_after_an_error(server):
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
    for size in ("7x7", "64x64"):
        body = json.dumps({"prompt": "x", "size": size, "steps": 2})
        conn.request("POST", GENERATIONS, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == (400 if size == "7x7" else 200)
    conn.close()


def test_renders_at_once_take_turns_and_give_the_same_images(server, client):
    """Three requests at once are rendered one after another: each image is the one it
    is alone (the generation thread never mixes their pieces up)."""

    def draw(seed: int) -> str:
        reply = client.images.generate(
            prompt="a hill", size="128x64", extra_body={"seed": seed, "steps": 3}
        )
        return reply.data[0].b64_json

    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(draw, [21, 22, 23]))
    assert together == [draw(seed) for seed in (21, 22, 23)]


@pytest.mark.parametrize("name", ["dall-e-3", "gpt-image-1", "dall-e-2"])
def test_openais_image_model_names_are_served_by_the_image_model(client, z_image_model, name):
    args = dict(prompt="a cat", size="64x64", extra_body={"seed": 8, "steps": 2})
    named = client.images.generate(model=str(z_image_model), **args)
    assert client.images.generate(model=name, **args).data == named.data


def test_with_keys_a_render_needs_one_and_is_metered_and_its_link_needs_none(
    launch, tiny_model, z_image_model, tmp_path
):
    db = tmp_path / "keys.sqlite"
    store = KeyStore(db)
    key = store.create(KeyRecord("painter", "", None))
    store.close()
    srv = launch(tiny_model, "--model", str(z_image_model), "--keys-db", str(db))
    body = {"prompt": "a cat", "size": "64x64", "steps": 2, "n": 2, "response_format": "url"}
    status, _, reply = srv.post(GENERATIONS, body)
    assert status == 401 and reply["error"]["code"] == "invalid_api_key"
    keyed = openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
    drawn = keyed.images.generate(
        prompt="a cat", size="64x64", n=2, response_format="url", extra_body={"steps": 2}
    )
    with urllib.request.urlopen(drawn.data[1].url, timeout=30) as response:  # no key
        assert response.status == 200 and response.read().startswith(b"\x89PNG")
    _, _, usage = srv.get("/v1/usage", {"Authorization": f"Bearer {key}"})
    row = next(r for r in usage["data"] if r["model"] == str(z_image_model))
    assert row["images"] == 2 and row["requests"] == 1
    assert row["prompt_tokens"] == drawn.usage.input_tokens
    assert row["completion_tokens"] == drawn.usage.output_tokens == 2 * 16
