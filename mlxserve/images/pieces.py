"""One lazily built MLX computation evaluated a part at a time: a pipeline's repeated
modules (the DiT's blocks, the VAE's convolutions) are marked, so that building a denoising
step's graph records each block's output; those are then evaluated one by one, each as a
piece of its own on the generation thread, before the result. The operations are those of
the library's own call, in its order: the result is the same, bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

import mlx.core as mx
from mlx import nn

T = TypeVar("T")


class Sink:
    """Where marked modules put their outputs while a graph is built (a plain object: a
    module attribute that is a list would be taken for parameters)."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []


class Marked(nn.Module):
    """A module whose output is recorded in `sink` each time it is called."""

    def __init__(self, inner: nn.Module, sink: Sink):
        super().__init__()
        self.inner = inner
        self.sink = sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        self.sink.outputs.append(out)
        return out


def mark(modules: list, sink: Sink) -> None:
    """Mark each module of a model's list of them, in place."""
    for i, module in enumerate(modules):
        modules[i] = Marked(module, sink)


def mark_pipeline(pipeline: Any) -> Sink:
    """Mark a Z-Image pipeline's DiT blocks, and its VAE's convolutions (encoder and
    decoder): at full resolution one VAE resnet is a DiT step's worth of work."""
    sink = Sink()
    transformer, vae = pipeline.transformer, pipeline.vae
    for blocks in (transformer.noise_refiner, transformer.context_refiner, transformer.layers):
        mark(blocks, sink)
    vae.decoder.mid_block = Marked(vae.decoder.mid_block, sink)
    for up in vae.decoder.up_blocks:
        _mark_resnets(up.resnets, sink)
        mark(up.upsamplers, sink)
    for down in vae.encoder.down_blocks:
        _mark_resnets(down.resnets, sink)
        mark(down.downsamplers, sink)
    return sink


def _mark_resnets(resnets: list, sink: Sink) -> None:
    for resnet in resnets:
        resnet.conv1 = Marked(resnet.conv1, sink)
        resnet.conv2 = Marked(resnet.conv2, sink)


def in_parts(build: Callable[[], T], sink: Sink) -> Generator[None, None, T]:
    """Build `build()`'s graph and evaluate its marked parts, yielding after each; the
    generator's return value is the result, evaluated."""
    sink.outputs.clear()
    result = build()
    parts, sink.outputs = sink.outputs, []
    for i, part in enumerate(parts):
        mx.eval(part)
        parts[i] = None  # evaluated: the next part holds what it needs of it
        yield
    mx.eval(result)
    return result
