"""Rows whose KV caches are quantized (--kv-bits, --kv-group-size; the caches themselves:
`caches/quantized_cache.py`). A prompt is processed at full precision, on a cache taken
back to full precision if it came quantized from the prompt cache, and quantized as its
rows join the batch (or as it is kept as a checkpoint)."""

from __future__ import annotations

from typing import Any

from mlxserve.engine.caches.prompt_cache import CacheHit
from mlxserve.engine.caches.quantized_cache import KVQuantization
from mlxserve.engine.continuous.row_feature import RowFeature
from mlxserve.engine.continuous.rows import WaitingPrompt
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.protocol.errors import ServiceError, bad_request


class KVQuantizationFeature(RowFeature):
    """Its rows' state is laid out apart from plain caches: not parked."""

    parks = False

    def __init__(self, bits: int, group_size: int):
        self._quantization = KVQuantization(bits, group_size)
        self.key = f"|kv{bits}/{group_size}"

    def joining(self, caches: list[Any]) -> list[Any]:
        return self._quantization.quantized(caches)

    def fetched(self, job: GenerationJob, hit: CacheHit) -> None:
        if hit.rest:
            hit.cache = self._quantization.plain(hit.cache)

    def whole_prompt(self, waiting: WaitingPrompt) -> bool:
        return True  # the batch quantizes from there

    def refused(self, error: ValueError) -> ServiceError:
        """A head that cannot be split into quantization groups."""
        quantization = self._quantization
        return bad_request(
            f"This model's KV cache cannot be quantized with --kv-bits "
            f"{quantization.bits} --kv-group-size {quantization.group_size}: {error}"
        )
