"""How a chat stream fares while the same server renders an image: the longest gap
between two tokens of a streamed reply (the 50M bench model) and its tokens per second,
alone, beside another chat request's 2,000-token prompt (the prefill stall a chat user
already sees), and beside a 512x512 render (--size) by a random-weight Z-Image pipeline of
BENCH_SIZE (its VAE at Z-Image's own size; the render is dropped, by closing its
connection, when the stream ends). Median of 3 rounds.

    make bench-image-fairness [ARGS="--size 256x256 --source DIR"]

--source runs the server from another checkout of mlxserve (to compare with a version
before a change), with this virtualenv.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from pathlib import Path

import models
from embedding_fairness import compare, start

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "fixtures"))
import image_fixture

SIZE = "512x512"
STEPS = 9  # Z-Image-Turbo's default
BENCH_SIZE = image_fixture.PipelineSize(
    transformer={
        **image_fixture.TRANSFORMER,
        "dim": 768,
        "n_layers": 12,
        "n_refiner_layers": 2,
        "n_heads": 12,
        "n_kv_heads": 12,
        "cap_feat_dim": 512,
        "axes_dims": [16, 24, 24],
    },
    text_encoder={  # the 50m bench model's shape
        **image_fixture.TEXT_ENCODER,
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 1408,
        "head_dim": 64,
    },
    vae={**image_fixture.VAE, "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2},
)


def bench_pipeline() -> Path:
    """The bench's Z-Image, built once beside the bench models."""
    chat = models.build(models.MODELS["50m"])
    out = chat.with_name("z-image-bench-random")
    if not (out / image_fixture.MODEL_INDEX_FILE).is_file():
        out.mkdir(exist_ok=True)
        image_fixture.make(out, chat, BENCH_SIZE)
    return out


def render_body(model: Path, size: str) -> str:
    return json.dumps(
        {"model": str(model), "prompt": "a red boat at sea", "size": size, "steps": STEPS}
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=Path, help="another mlxserve checkout to run")
    parser.add_argument("--size", default=SIZE, help="the image's WIDTHxHEIGHT")
    parser.add_argument(
        "--tokens",
        type=int,
        default=120,
        help="the stream's length: outlast the render to measure its decode too",
    )
    args = parser.parse_args()
    chat = models.build(models.MODELS["50m"])
    pipeline = bench_pipeline()
    process, url = start(chat, pipeline, args.source)
    host = url.removeprefix("http://")
    headers = {"Content-Type": "application/json"}
    try:

        def render(ended: threading.Event) -> None:
            connection = http.client.HTTPConnection(host, timeout=600)
            connection.request(
                "POST", "/v1/images/generations", render_body(pipeline, args.size), headers
            )
            ended.wait()
            connection.close()  # the server stops the render at its next step

        started = time.perf_counter()
        connection = http.client.HTTPConnection(host, timeout=900)
        connection.request(
            "POST", "/v1/images/generations", render_body(pipeline, args.size), headers
        )
        connection.getresponse().read()  # warm-up, and the time a render takes alone
        took = time.perf_counter() - started
        print(f"a {args.size} render of {STEPS} steps alone: {took:.1f} s")
        compare(url, chat, f"{args.size} render", render, args.tokens)
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
