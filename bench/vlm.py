"""Vision-language serving: mlxserve against mlx-vlm's own server (`python -m
mlx_vlm.server`), in one run, at 1, 4 and 8 concurrent streams, text-only and with one
image each (or, `--media video`, one 5-second clip each).

The model is a random-weight qwen2_vl (or, `--family llama4`, Llama 4: chunked attention,
experts; `--media video`, Qwen2.5-VL) with the bench models' 256-wide, 4-layer language
model and the family's vision fixture's tokenizer, processor and vision tower
(tests/fixtures/vision_fixture.py). Each request streams 128 tokens at temperature 1 (end
tokens forbidden by logit_bias where the server honours it); each image and clip is fresh
noise, so no cache of either server sees it twice. Clips are MP4 files both servers read
from one folder (mlx_vlm.server reads a video from a path or URL only), sampled at 2
frames a second by both (10 frames: 320 tokens at 224x224). Rounds alternate the servers; figures are the
median over rounds and the ratio mlxserve / mlx_vlm.server, over the streams a server
answered (a stream it cut, an error after the headers, counts under "streams cut").

Fairness, on mlxserve: a stream's longest gap between two tokens while a prompt with one
896x896 image (1,024 image tokens: the bench folder's processor allows that many), or a
5-second clip of 448x448 frames (1,280 tokens), is processed beside it, against a text
prompt of the same length (qwen2_vl and qwen2_5_vl only).

    make bench-vlm
    make bench-vlm ARGS="--rounds 3 --streams 1 8"
    make bench-vlm ARGS="--family llama4"
    make bench-vlm ARGS="--media video --streams 8"
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import Reply, Target
from load_gap import longest_gap_during

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "fixtures"))
import vision_fixture

SERVERS = ("mlxserve", "mlx_vlm.server")
LANGUAGE = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 704,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
MAX_TOKENS = 128
QUESTION = "Describe what you see, then tell a long story about it."
LARGE_IMAGE = 896  # pixels a side: 32 x 32 image tokens of 28 pixels
LARGE_IMAGE_TOKENS = (LARGE_IMAGE // (2 * vision_fixture.PATCH)) ** 2
CLIP_SECONDS, CLIP_FPS, CLIP_SIDE, LARGE_CLIP_SIDE = 5, 8, 224, 448
SAMPLED = CLIP_SECONDS * 2  # frames both servers take of a clip (2 a second)
LARGE_CLIP_TOKENS = SAMPLED // 2 * (LARGE_CLIP_SIDE // (2 * vision_fixture.PATCH)) ** 2
_noise = random.Random(0)


@dataclass(frozen=True)
class Family:
    """A vision family the bench serves: its fixture (tokenizer, processor, vision
    tower), its language model's settings (at LANGUAGE's size) and its end tokens."""

    fixture: vision_fixture.VisionFamily
    language: Callable[[dict], dict]  # the fixture's config, resized
    ends: tuple[str, ...]


def _qwen2_vl(config: dict) -> dict:
    # the vision tower's merger writes the language model's width
    vision = {**config["vision_config"], "hidden_size": LANGUAGE["hidden_size"]}
    return {**config, **LANGUAGE, "vision_config": vision}


def _qwen2_5_vl(config: dict) -> dict:
    # the vision tower's merger writes the language model's width
    vision = {**config["vision_config"], "out_hidden_size": LANGUAGE["hidden_size"]}
    return {**config, **LANGUAGE, "vision_config": vision}


def _llama4(config: dict) -> dict:
    text = {**config["text_config"], **LANGUAGE, "head_dim": 32}
    return {**config, "text_config": text}


FAMILIES = {
    "qwen2_vl": Family(vision_fixture.QWEN2_VL, _qwen2_vl, ("<|im_end|>", "<|endoftext|>")),
    # Llama 4: chunked attention (the fixture's chunks of 16 tokens), experts, tiled images
    "llama4": Family(vision_fixture.LLAMA4, _llama4, ("<|eot|>", "<|end_of_text|>")),
    "qwen2_5_vl": Family(vision_fixture.QWEN25_VL, _qwen2_5_vl, ("<|im_end|>", "<|endoftext|>")),
}


def build_model(name: str) -> Path:
    """The bench's folder of the family, built once under the mlxserve cache."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, update_module_configs
    from models import device_dtype

    from mlxserve.models.demo import cache_root

    family = FAMILIES[name]
    dtype = device_dtype()
    out = cache_root() / "bench" / f"{name.replace('_', '-')}-256-{dtype}"
    if (out / "model.safetensors").is_file():
        return out
    fixture = vision_fixture.build(cache_root() / "fixtures", family.fixture)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(fixture, partial, ignore=shutil.ignore_patterns("*.safetensors"))
    config = family.language(json.loads((fixture / "config.json").read_text()))
    config["torch_dtype"] = dtype
    (partial / "config.json").write_text(json.dumps(config, indent=2))
    processor = json.loads((partial / "preprocessor_config.json").read_text())
    processor["max_pixels"] = LARGE_IMAGE**2
    (partial / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    video = partial / "video_preprocessor_config.json"
    if video.is_file():  # a whole clip's frames x height x width: the large clip's
        settings = json.loads(video.read_text())
        settings["max_pixels"] = SAMPLED * LARGE_CLIP_SIDE**2
        video.write_text(json.dumps(settings, indent=2))
    mx.random.seed(0)
    module, _ = get_model_and_args(dict(config))
    settings = {"text_config": {}, **config}
    model_config = module.ModelConfig.from_dict(settings)
    model = module.Model(update_module_configs(model_config, module, settings, ["text", "vision"]))
    model.set_dtype(getattr(mx, dtype))
    mx.save_safetensors(str(partial / "model.safetensors"), dict(tree_flatten(model.parameters())))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def noise_image(size: int = 112) -> str:
    """A fresh noise PNG of `size` pixels a side as a data URI (112: 16 image tokens)."""
    from PIL import Image

    pixels = _noise.randbytes(size * size * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (size, size), pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


# Where the clips are written: both servers read them from here (mlxserve: --image-dir)
CLIPS = Path(tempfile.mkdtemp(prefix="bench-clips-"))


def noise_clip(side: int = CLIP_SIDE) -> str:
    """A fresh 5-second clip of noise frames, `side` pixels a side, as an MP4 file."""
    import av
    import numpy as np

    path = CLIPS / f"clip-{time.time_ns()}.mp4"
    rng = np.random.default_rng(_noise.randrange(2**32))
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=CLIP_FPS)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        for _ in range(CLIP_SECONDS * CLIP_FPS):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode(None))
    return str(path)


def messages(media: str | None, size: int | None = None) -> list[dict]:
    """A fresh user turn, text only or with one image or clip (`size`: its side)."""
    opening = f"Request {time.time_ns()}. {QUESTION}"
    if media is None:
        return [{"role": "user", "content": opening}]
    if media == "video":
        part = {"type": "video_url", "video_url": {"url": noise_clip(size or CLIP_SIDE)}}
    else:
        part = {"type": "image_url", "image_url": {"url": noise_image(size or 112)}}
    return [{"role": "user", "content": [part, {"type": "text", "text": opening}]}]


def run(target: Target, streams: int, media: str | None, logit_bias: dict) -> dict[str, float]:
    requests = [(messages(media), MAX_TOKENS) for _ in range(streams)]
    # mlx_vlm.server wants the model named in each request; mlxserve serves its default
    models = [target.model] * streams if target.kind == "mlx_vlm.server" else None
    started = time.perf_counter()
    replies: list[Reply] = target.chat_together(
        requests, logit_bias, models=models, temperature=1.0
    )
    target.settle()
    answered = [r for r in replies if r.stamps]  # a stream the server cut sent no token
    if not answered:
        return {
            "aggregate tok/s": 0.0,
            "slowest first token s": math.nan,
            "streams cut": streams,
            "prompt tokens": math.nan,
        }
    ended = max(r.finished for r in answered)
    return {
        "aggregate tok/s": sum(r.completion_tokens for r in answered) / (ended - started),
        "slowest first token s": max(r.ttft for r in answered),
        "streams cut": len(replies) - len(answered),
        "prompt tokens": max(r.prompt_tokens for r in answered),  # the same work for both
    }


def fairness(target: Target, tokenizer, logit_bias: dict, media: str) -> dict[str, float]:
    """A stream's longest gap while a large image (or clip) prompt is processed beside
    it, and while a text prompt of as many tokens is (its words fresh each call, as the
    image is: the prompt cache must not hold it)."""
    size, tokens = (
        (LARGE_CLIP_SIDE, LARGE_CLIP_TOKENS)
        if media == "video"
        else (LARGE_IMAGE, LARGE_IMAGE_TOKENS)
    )
    large = messages(media, size)
    first = _noise.randrange(10**6)
    words = " ".join(f"note{first + i}" for i in range(tokens))
    while len(tokenizer.encode(words)) > tokens:
        words = words.rsplit(" ", 1)[0]
    text = [{"role": "user", "content": f"{words} {QUESTION}"}]
    figures = {}
    for name, prompt in ((media, large), ("text", text)):
        asked = {"messages": prompt, "max_tokens": 4, "logit_bias": logit_bias}
        gap, _ = longest_gap_during(target, messages(None), logit_bias, asked)
        figures[f"longest gap s beside a {tokens}-token {name} prompt"] = gap
        target.settle()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--family", choices=list(FAMILIES), default=None)
    parser.add_argument("--media", choices=["image", "video"], default="image")
    args = parser.parse_args()
    family = args.family or ("qwen2_5_vl" if args.media == "video" else "qwen2_vl")
    model = build_model(family)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    ends = FAMILIES[family].ends
    logit_bias = {str(tokenizer.convert_tokens_to_ids(t)): -100 for t in ends}
    results: dict[tuple, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for kind in SERVERS:
            extra = ("--host", "127.0.0.1") if kind == "mlx_vlm.server" else ()
            extra += ("--image-dir", str(CLIPS)) if kind == "mlxserve" else ()
            target = Target(kind, model, *extra)
            try:
                run(target, 1, args.media, logit_bias)  # warm up both paths
                run(target, 1, None, logit_bias)
                for streams in args.streams:
                    for media in (None, args.media):
                        figures = run(target, streams, media, logit_bias)
                        for name, value in figures.items():
                            results.setdefault((streams, media, name, kind), []).append(value)
                if kind == "mlxserve" and family in ("qwen2_vl", "qwen2_5_vl"):
                    for name, value in fairness(target, tokenizer, logit_bias, args.media).items():
                        gaps.setdefault(name, []).append(value)
            finally:
                target.stop()
    shutil.rmtree(CLIPS, ignore_errors=True)
    report(results, args.streams, args.rounds, args.media)
    print("\nmlxserve, median (min-max):")
    for name, values in gaps.items():
        print(f"- {name}: {spread(values)}")


def report(results: dict, streams: list[int], rounds: int, media: str) -> None:
    """Medians (min-max) over rounds; the ratio's are of each round's pair (the servers
    alternate, so a round's two figures are measured closest in time)."""
    print(f"\n{rounds} rounds, median (min-max); ratio = mlxserve / mlx_vlm.server")
    print("| streams | prompt | figure | mlxserve | mlx_vlm.server | ratio |")
    print("|---|---|---|---|---|---|")
    for n in streams:
        for given in (None, media):
            for name in (
                "aggregate tok/s",
                "slowest first token s",
                "streams cut",
                "prompt tokens",
            ):
                ours, theirs = (results[(n, given, name, kind)] for kind in SERVERS)
                ratios = [a / b if b else math.nan for a, b in zip(ours, theirs, strict=True)]
                prompt = (
                    "text only"
                    if given is None
                    else f"one {'clip' if given == 'video' else 'image'}"
                )
                cells = " | ".join(spread(v) for v in (ours, theirs, ratios))
                print(f"| {n} | {prompt} | {name} | {cells} |")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
