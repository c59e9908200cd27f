"""Work that is not a token stream (embeddings, reranking, audio, images) shares the
generation thread with the chat streams: it runs in bounded pieces between the loop's
steps, inputs batched so that no piece holds the thread much longer than a chat prefill
chunk."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.protocol.errors import ClientGone

T = TypeVar("T")
EMBED_BATCH = 32  # the most inputs embedded (or scored) in one forward pass

# When the calling thread (a request's) may send its next piece: a piece's result goes back
# at once, and the wait that gives the chat streams their share comes before the next.
_next_piece = threading.local()


def shared_call(
    worker: GenerationWorker, fn: Callable[[], T], client_gone: Callable[[], bool]
) -> T:
    """Run one piece of work on the generation thread. While chat streams decode, the
    caller's next piece waits as long as this one took, so that such work takes at most
    half of the thread from them; the result is the caller's meanwhile (a spoken
    sentence plays, a transcript streams). A client that has gone stops the work at the
    next piece."""
    wait = getattr(_next_piece, "at", 0.0) - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    if client_gone():
        raise ClientGone
    started = time.monotonic()
    result = worker.call(fn)
    ended = time.monotonic()
    # chat streams decode: they get as long as this piece took
    _next_piece.at = ended + (ended - started) if worker.running else 0.0
    return result


def batches(inputs: list[list[int]], tokens: int, most: int) -> list[list[int]]:
    """The inputs' indices in batches for one forward pass each: shortest first (less
    padding), each of at most `most` inputs and `tokens` tokens padded (an input longer
    than that goes alone), so that no pass holds the generation thread much longer than a
    chat prefill chunk."""
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    out: list[list[int]] = []
    for i in order:
        batch = out[-1] if out else None
        longest = len(inputs[i])  # the longest so far: inputs come shortest first
        if batch is None or len(batch) >= most or (len(batch) + 1) * longest > tokens:
            out.append([i])
        else:
            batch.append(i)
    return out
