"""The edge put together: each dialect's endpoints made over the service, and their routes
mounted on the one router."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxserve.api import model_routes, server_routes
from mlxserve.api.anthropic import routes as anthropic_routes
from mlxserve.api.anthropic.endpoints import AnthropicEndpoints
from mlxserve.api.audio import routes as audio_routes
from mlxserve.api.audio.speech import SpeechEndpoints
from mlxserve.api.audio.transcriptions import TranscriptionEndpoints
from mlxserve.api.batches import routes as batch_routes
from mlxserve.api.batches.anthropic import MESSAGES, MessageBatchEndpoints
from mlxserve.api.batches.keeper import BatchKeeper
from mlxserve.api.batches.openai import (
    BATCH_ENDPOINTS,
    BatchEndpoints,
    FileEndpoints,
    output_files,
)
from mlxserve.api.batches.runner import Outputs
from mlxserve.api.images import routes as image_routes
from mlxserve.api.images.endpoints import ImageEndpoints
from mlxserve.api.images.links import ImageLinks
from mlxserve.api.infill import routes as infill_routes
from mlxserve.api.infill.endpoints import InfillEndpoints
from mlxserve.api.ollama import routes as ollama_routes
from mlxserve.api.ollama.endpoints import OllamaEndpoints
from mlxserve.api.ollama.names import ModelNames, names_path
from mlxserve.api.openai import routes as openai_routes
from mlxserve.api.openai.embeddings import EmbeddingEndpoints
from mlxserve.api.openai.endpoints import OpenAIEndpoints
from mlxserve.api.openai.errors import ERRORS as OPENAI_ERRORS
from mlxserve.api.openai.tokenize import TokenizeEndpoints
from mlxserve.api.openapi import document as openapi
from mlxserve.api.realtime import routes as realtime_routes
from mlxserve.api.rerank import routes as rerank_routes
from mlxserve.api.rerank.endpoints import RerankEndpoints
from mlxserve.api.responses import routes as responses_routes
from mlxserve.api.responses.endpoints import ResponsesEndpoints
from mlxserve.api.responses.files import FileInputs
from mlxserve.api.router import Router
from mlxserve.api.status import StatusEndpoint
from mlxserve.api.usage import UsageEndpoints
from mlxserve.api.websocket import OpenSockets
from mlxserve.keys.gate import KeyGate
from mlxserve.keys.store import keys_path
from mlxserve.mcp import config as mcp_config
from mlxserve.mcp.hub import McpHub
from mlxserve.service.chat import ChatService
from mlxserve.telemetry.activity import Activity
from mlxserve.telemetry.metrics import Metrics


@dataclass
class Routes:
    service: ChatService
    metrics: Metrics = field(default_factory=Metrics)
    activity: Activity = field(default_factory=Activity)
    router: Router = field(default_factory=lambda: Router(OPENAI_ERRORS))
    open_sockets: OpenSockets = field(default_factory=OpenSockets)
    keys: KeyGate = field(init=False)
    mcp: McpHub = field(init=False)
    batch_keeper: BatchKeeper = field(init=False)

    def __post_init__(self):
        config, service, mount = self.service.config, self.service, self.router.mount
        self.keys = KeyGate(keys_path(config.keys_db), config.api_key, config.keys_db is not None)
        self.mcp = McpHub(
            mcp_config.load(config.mcp_config) if config.mcp_config else (),
            config.mcp_call_timeout,
            config.mcp_max_output,
        )
        openai = OpenAIEndpoints(service)
        mount(openai, openai_routes.ROUTES)
        mount(openai, model_routes.ROUTES)
        mount(EmbeddingEndpoints(service), openai_routes.EMBEDDING_ROUTES)
        mount(TokenizeEndpoints(service), openai_routes.TOKEN_ROUTES)
        mount(AnthropicEndpoints(service, self.mcp), anthropic_routes.ROUTES)
        # the batch keeper (made below) holds the files a Responses request may name
        files = FileInputs(lambda: self.batch_keeper.store())
        responses = ResponsesEndpoints(service, files, self.mcp)
        mount(responses, responses_routes.ROUTES)
        mount(responses.conversations, responses_routes.CONVERSATION_ROUTES)
        self.router.mount_sockets(responses, responses_routes.SOCKET_ROUTES)
        self.router.mount_sockets(service, realtime_routes.SOCKET_ROUTES)
        mount(TranscriptionEndpoints(service), audio_routes.TRANSCRIPTION_ROUTES)
        mount(SpeechEndpoints(service), audio_routes.SPEECH_ROUTES)
        links = ImageLinks()
        mount(ImageEndpoints(service, links), image_routes.ROUTES)
        mount(links, image_routes.LINK_ROUTES)
        mount(RerankEndpoints(service), rerank_routes.ROUTES)
        mount(InfillEndpoints(service), infill_routes.ROUTES)
        names = ModelNames(names_path(config.model_names_db))
        mount(OllamaEndpoints(service, names), ollama_routes.ROUTES)
        self.batch_keeper = keeper = self._batch_keeper()
        mount(FileEndpoints(keeper), batch_routes.FILE_ROUTES)
        mount(BatchEndpoints(keeper), batch_routes.BATCH_ROUTES)
        mount(MessageBatchEndpoints(keeper), batch_routes.MESSAGE_BATCH_ROUTES)
        mount(None, server_routes.PAGE_ROUTES)
        status = StatusEndpoint(
            service, self.activity, keeper, self.keys, self.open_sockets, self.mcp
        )
        mount(status, server_routes.STATUS_ROUTES)
        mount(UsageEndpoints(self.keys), server_routes.USAGE_ROUTES)
        mount(self.mcp, server_routes.MCP_ROUTES)
        mount(self.metrics, server_routes.METRICS_ROUTES)
        mount(openapi.OpenApi(self.router), openapi.ROUTES)

    def _batch_keeper(self) -> BatchKeeper:
        """Batch lines run through the endpoints a client's request of their kind takes."""
        router = self.router
        lines = {path: router.endpoint(path) for path in (*BATCH_ENDPOINTS, MESSAGES)}
        outputs: dict[str, Outputs] = {"openai": output_files}
        return BatchKeeper(
            self.service.config,
            lines,
            lambda path: router.errors("POST", path),
            outputs,
            self.keys,
            self.activity.token,
        )
