"""Reading a model into memory: its weights (a share of them on each rank of a distributed
server), its drafter (a draft model, the checkpoint's MTP head, an EAGLE-3 or DFlash
drafter) and its tokenizer. Any thread may read (loading.py); the resident set
(resident_set.py) takes what was read."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from mlxserve.adapters.layers import ModelAdapters
from mlxserve.config import ServerConfig
from mlxserve.engine.drafters.dflash import DFlashDrafter, DFlashUnsupported
from mlxserve.engine.drafters.eagle3 import Eagle3Drafter, drafter_kind
from mlxserve.engine.drafters.mtp_load import load_head
from mlxserve.models.chunked_attention import batch_chunked_attention
from mlxserve.models.kinds import LoadRequest
from mlxserve.models.spec import ModelSpec, load_error, stored_bytes
from mlxserve.models.vision_loader import load_vision_model
from mlxserve.protocol.errors import ServiceError, bad_request
from mlxserve.units import GB, format_bytes

log = logging.getLogger(__name__)

PROGRESS_BYTES = GB  # a load this large logs its progress,
PROGRESS_STEPS = 4  # a quarter at a time

# Splits a lazily loaded model across the ranks of a distributed server before its
# weights are read (each rank then reads only its share).
Split = Callable[[Any], None]


@dataclass
class LoadedModel:
    spec: ModelSpec
    # an mlx-lm model; an mlx-vlm one when spec.vision; else the kind's own wrapper
    # (EmbeddingModel, a reranker, Transcriber, Synthesizer)
    model: Any
    tokenizer: Any  # None for the audio kinds
    draft_model: Any | None
    nbytes: int = 0  # the weights' memory, the draft model's and the head's included
    # A drafter that reads the model's hidden states: the checkpoint's MTP head
    # (drafters.mtp_head.MTPHead), an EAGLE-3 --draft-model (drafters.eagle3.Eagle3Drafter) or a
    # DFlash one (drafters.dflash.DFlashDrafter)
    head: Any | None = None
    # The adapters resident in a text model (rows of one batch each under their own);
    # None where a model takes none (other kinds, --adapter-path, across machines)
    adapters: ModelAdapters | None = None

    def drop_draft_model(self) -> None:
        """Let the draft model go (it cannot draft for this model), its weights with it."""
        self.nbytes -= _weight_bytes(self.draft_model)
        self.draft_model = None


@dataclass
class ModelLoader:
    config: ServerConfig
    tokenizer: Callable[[ModelSpec], Any]  # the kept tokenizer of a spec (the catalog's)
    split: Split | None = None

    def read(self, spec: ModelSpec) -> LoadedModel:
        """Load `spec`'s weights (evaluated) and tokenizer without making it resident: any
        thread may (engine/memory/loading.py), `install` hands it over."""
        import mlx.core as mx

        log.info(
            "Loading model from %s (%s, %s of weights)",
            spec.path,
            spec.kind,
            format_bytes(stored_bytes(spec)),
        )
        start = time.perf_counter()
        try:
            model, draft, head = self._load_weights(spec)
            tokenizer = self.tokenizer(spec) if spec.model_kind.tokenizer else None
        except ServiceError:
            raise
        except Exception as e:
            raise load_error(spec, e) from e
        nbytes = _weight_bytes(model, draft, head)
        takes_adapters = spec.kind == "chat" and not spec.adapter_path and self.split is None
        adapters = ModelAdapters(model) if takes_adapters else None
        loaded = LoadedModel(spec, model, tokenizer, draft, nbytes, head, adapters)
        log.info(
            "Loaded %s in %.1fs (peak memory %s, active %s)",
            spec.path,
            time.perf_counter() - start,
            format_bytes(mx.get_peak_memory()),
            format_bytes(mx.get_active_memory()),
        )
        mx.reset_peak_memory()
        return loaded

    def _load_weights(self, spec: ModelSpec) -> tuple[Any, Any | None, Any | None]:
        """(model, draft model or None, hidden-state drafter or None)."""
        from mlx_lm.utils import load_adapters, load_model

        trust = self.config.trust_remote_code
        kind = spec.model_kind
        if kind.load is not None:
            tokenizer = self.tokenizer(spec) if kind.tokenizer else None
            return kind.load(LoadRequest(spec.path, tokenizer, trust)), None, None
        if spec.vision:
            if spec.draft_path is not None and drafter_kind(spec.draft_path) is not None:
                raise bad_request(
                    f"{spec.draft_path.name} drafts from a text model's hidden states: a "
                    "vision model drafts with a small language model (--draft-model) or "
                    "from the context (--speculation)."
                )
            draft = _draft_model(spec.draft_path)
            vision = load_vision_model(spec.path, spec.adapter_path)
            self._split_and_read(vision, spec.path.name)
            return vision, draft, self._mtp_head(spec, vision) if draft is None else None
        model, _ = load_model(spec.path, lazy=True, trust_remote_code=trust)
        batch_chunked_attention(model)
        self._split_and_read(model, spec.path.name)
        if spec.adapter_path:
            model = load_adapters(model, spec.adapter_path)
            model.eval()
        drafter = drafter_kind(spec.draft_path) if spec.draft_path is not None else None
        if spec.draft_path is not None and drafter == "eagle3":
            log.info("Read an EAGLE-3 drafter from %s", spec.draft_path.name)
            return model, None, Eagle3Drafter.load(spec.draft_path, model)
        if spec.draft_path is not None and drafter == "dflash":
            log.info("Read a DFlash drafter from %s", spec.draft_path.name)
            try:
                return model, None, DFlashDrafter.load(spec.draft_path, model)
            except DFlashUnsupported as e:
                raise bad_request(f"{e}: give --draft-model another drafter.") from e
        if spec.draft_path is not None and drafter is not None:
            raise bad_request(
                f"{spec.draft_path.name} is a {drafter} drafter, which mlxserve does not serve: "
                "give --draft-model a DFlash or EAGLE-3 drafter or a small language model "
                "(a checkpoint's own MTP head is read from the model itself, see --mtp)."
            )
        draft = _draft_model(spec.draft_path)
        return model, draft, self._mtp_head(spec, model) if draft is None else None

    def _split_and_read(self, model: Any, name: str) -> None:
        """Split a lazily loaded model across the ranks of a distributed server, then
        read its weights (this rank's share of them)."""
        if self.split is not None:
            self.split(model)
        read_weights(model, name)

    def _mtp_head(self, spec: ModelSpec, model: Any) -> Any | None:
        """The checkpoint's MTP head, unless --mtp is off or the model is not a chat or
        vision model of a family whose head we read; a head that does not load is a
        warning (the model is served without it)."""
        if self.config.mtp == "off" or not spec.model_kind.generative or spec.adapter_path:
            return None
        try:
            head = load_head(model, spec.path)
        except Exception as e:  # the head is an extra: the model serves without it
            log.warning(
                "The MTP head of %s could not be read (%s): served without it", spec.path.name, e
            )
            return None
        if head is not None:
            log.info("Read a %s from %s", head.name, spec.path.name)  # "... MTP head"
        return head


def read_weights(model: Any, name: str) -> None:
    """Read a lazily loaded model's weights into memory a share at a time, logging the
    progress of a large one (a load of many GB takes a while, and should say so)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    arrays: list[mx.array] = [cast(mx.array, pair[1]) for pair in tree_flatten(model.parameters())]
    total = sum(array.nbytes for array in arrays)
    step = max(total // PROGRESS_STEPS, 1)
    done, group_bytes = 0, 0
    group: list[mx.array] = []
    for array in arrays:
        group.append(array)
        group_bytes += array.nbytes
        if group_bytes >= step or array is arrays[-1]:
            mx.eval(group)
            done += group_bytes
            group, group_bytes = [], 0
            if total >= PROGRESS_BYTES and done < total:
                log.info("Loading %s: %d%% of %s", name, 100 * done // total, format_bytes(total))


def _weight_bytes(*models: Any) -> int:
    from mlx.utils import tree_flatten

    arrays: list[Any] = [
        pair[1] for m in models if m is not None for pair in tree_flatten(m.parameters())
    ]
    return sum(array.nbytes for array in arrays)


def _draft_model(path: Path | None) -> Any | None:
    """The draft model (--draft-model) as mlx-lm loads it, mended as the model is."""
    if path is None:
        return None
    from mlx_lm.utils import load_model

    model = load_model(path)[0]
    batch_chunked_attention(model)
    return model
