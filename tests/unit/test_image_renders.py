"""The image path's parts in this process: a render a piece at a time equals mlx-vlm's
own pipeline, the pieces are the marked modules, the reaches into mlx-vlm's Z-Image code
exist, and the pure helpers (sizes, masks, partial-image steps, links)."""

from __future__ import annotations

import inspect
import time

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_vlm.models.z_image.pipeline import ZImagePipeline

from mlxserve import compat
from mlxserve.api.images.endpoints import _size
from mlxserve.api.images.links import LINK_PREFIX, ImageLinks
from mlxserve.images.pieces import Sink, in_parts, mark
from mlxserve.images.render import ImageJob, ImageModel, _latent_edit_mask, _preview_steps
from mlxserve.protocol.errors import ServiceError


@pytest.fixture(scope="module")
def model(z_image_model):
    return ImageModel.load(z_image_model)


def run(render) -> tuple[int, list]:
    pieces, previews = 0, []
    while render.image is None:
        preview = render.step()
        pieces += 1
        if preview is not None:
            previews.append(preview)
    return pieces, previews


def test_a_render_in_pieces_is_the_librarys_image(model):
    render = model.begin(ImageJob("a red square", 128, 64, 5, 3, previews=2))
    pieces, previews = run(render)
    expected = model.pipeline.generate_array("a red square", seed=3, steps=5, width=128, height=64)
    assert np.array_equal(render.image, np.array(expected))
    assert len(previews) == 2 and all(p.shape == (64, 128, 3) for p in previews)
    blocks = len(model.pipeline.transformer.layers) + 2  # and the two refiners
    assert pieces > 4 * blocks  # 4 denoising steps, a piece per block at least


def test_the_reaches_into_mlx_vlms_z_image():
    assert callable(ZImagePipeline._ensure_components)
    signature = inspect.signature(ZImagePipeline._encode_conditioning)
    assert {"prompt", "guidance", "negative_prompt"} <= set(signature.parameters)
    assert compat.img2img_start_index(8, 0.6) == 3  # diffusers' floor(N * (1 - strength))


def test_marked_parts_are_evaluated_one_by_one_to_the_same_result():
    mx.random.seed(0)
    layers = [nn.Linear(8, 8) for _ in range(3)]
    x = mx.random.normal((2, 8))

    def forward() -> mx.array:
        y = x
        for layer in layers:
            y = nn.gelu(layer(y))
        return y

    expected = forward()
    mx.eval(expected)
    sink = Sink()
    mark(layers, sink)
    parts = in_parts(forward, sink)
    yielded = 0
    while True:
        try:
            next(parts)
            yielded += 1
        except StopIteration as done:
            result = done.value
            break
    assert yielded == 3 and sink.outputs == []
    assert np.array_equal(np.array(result), np.array(expected))


def test_partial_images_spread_over_the_steps_never_the_last():
    assert _preview_steps(0, 8, 3) == {2, 4, 6}
    assert _preview_steps(0, 8, 0) == frozenset()
    assert _preview_steps(5, 8, 3) == {6, 7}  # an edit from step 5: no duplicates, none at 8
    assert _preview_steps(0, 1, 2) == frozenset()


def test_a_latent_cell_is_redrawn_if_any_of_its_pixels_is():
    keep = np.ones((16, 24), dtype=bool)
    keep[9, 17] = False  # one pixel of the cell at (1, 2)
    cells = _latent_edit_mask(keep)
    assert cells.shape == (2, 3) and cells.sum() == 1 and cells[1, 2] == 1.0


@pytest.mark.parametrize(
    "size, source, expected",
    [
        ("auto", None, (1024, 1024)),
        ("512x256", None, (512, 256)),
        ("auto", (1000, 500), (992, 496)),
        ("auto", (4096, 1024), (2048, 512)),
    ],
)
def test_sizes(size, source, expected):
    assert _size(size, source) == expected


@pytest.mark.parametrize("size", ["100x100", "32x64", "4096x64", "1024", "axb", "-64x64"])
def test_sizes_refused(size):
    with pytest.raises(ServiceError) as refused:
        _size(size, None)
    assert refused.value.param == "size"


def test_links_expire_and_the_oldest_go_past_the_bound():
    links = ImageLinks(seconds=0.2, max_bytes=10)
    first_path = links.add(b"12345", "image/png", "png")
    second = links.add(b"67890", "image/png", "png").removeprefix(LINK_PREFIX)
    assert first_path.startswith(LINK_PREFIX) and first_path.endswith(".png")
    first = first_path.removeprefix(LINK_PREFIX)  # the name the link's route is given
    assert links.get(first).data == b"12345"
    links.add(b"abc", "image/png", "png")  # 13 bytes kept: the oldest goes
    with pytest.raises(ServiceError):
        links.get(first)
    assert links.get(second).data == b"67890"
    time.sleep(0.25)
    with pytest.raises(ServiceError):
        links.get(second)
