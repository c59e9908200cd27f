"""Every model kind the server serves, registered with models/ (which imports none of the
packages that serve them): the server and the command line's model commands call
`register_all` before they look at a model folder."""

from __future__ import annotations

from mlxserve.audio.kind import SPEECH, TRANSCRIPTION
from mlxserve.images.kind import IMAGE
from mlxserve.models.kinds import KINDS
from mlxserve.rerank.kind import RERANK


def register_all() -> None:
    for kind in (RERANK, TRANSCRIPTION, SPEECH, IMAGE):
        KINDS.register(kind)
