"""Renders on the generation thread, a piece at a time (a DiT block, a VAE convolution:
see render.py) between the chat streams' steps (engine/loop/sharing.py): a chat stream keeps
its pace while an image renders, and a client that leaves stops its render at the next
piece. Renders take turns, one at a time: two at once would each take twice as long and
hold twice the memory."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from mlxserve.engine.loop.sharing import shared_call
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.images.render import ImageJob, ImageModel, Render
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import ClientGone

WAIT_POLL_SECONDS = 0.1  # how often a request waiting its turn looks for its client


@dataclass(frozen=True)
class Rendered:
    """A request's image `index`: a partial image on the way, or the finished one."""

    index: int
    image: np.ndarray
    final: bool
    prompt_tokens: int


@dataclass
class Renders:
    worker: GenerationWorker
    _turn: threading.Lock = field(default_factory=threading.Lock)

    def render(
        self, spec: ModelSpec, jobs: list[ImageJob], client_gone: Callable[[], bool]
    ) -> Iterator[Rendered]:
        """Each job's partial images and image, in order, each computed when the one
        before it is taken, once it is this request's turn."""
        while not self._turn.acquire(timeout=WAIT_POLL_SECONDS):
            if client_gone():
                raise ClientGone
        try:
            yield from self._render(spec, jobs, client_gone)
        finally:
            self._turn.release()

    def _render(
        self, spec: ModelSpec, jobs: list[ImageJob], client_gone: Callable[[], bool]
    ) -> Iterator[Rendered]:
        worker = self.worker
        for index, job in enumerate(jobs):
            begin = partial(worker.run_with, spec, partial(_begin, job))
            current: Render = shared_call(worker, begin, client_gone)
            while current.image is None:
                preview = shared_call(worker, current.step, client_gone)
                if preview is not None:
                    yield Rendered(index, preview, False, current.prompt_tokens)
            yield Rendered(index, current.image, True, current.prompt_tokens)


def _begin(job: ImageJob, model: ImageModel) -> Render:
    return model.begin(job)
