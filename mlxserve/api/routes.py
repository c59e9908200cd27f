"""Which dialect answers which path, and in which dialect's shape its errors go out."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from email.message import Message
from operator import attrgetter

from mlxserve.api.anthropic.endpoints import AnthropicEndpoints
from mlxserve.api.anthropic.errors import error_reply as anthropic_error
from mlxserve.api.anthropic.models import model_info, model_page, speaks_anthropic
from mlxserve.api.audio.speech import SpeechEndpoints
from mlxserve.api.audio.transcriptions import TranscriptionEndpoints
from mlxserve.api.batches import routes as batch_paths
from mlxserve.api.batches.anthropic import MESSAGES, MessageBatchEndpoints
from mlxserve.api.batches.keeper import BatchKeeper
from mlxserve.api.batches.openai import (
    BATCH_ENDPOINTS,
    BatchEndpoints,
    FileEndpoints,
    output_files,
)
from mlxserve.api.batches.routes import BatchRoutes
from mlxserve.api.batches.runner import Outputs
from mlxserve.api.errors import ErrorRenderer
from mlxserve.api.images.endpoints import ImageEndpoints
from mlxserve.api.images.links import LINK_PREFIX, ImageLinks
from mlxserve.api.infill.endpoints import InfillEndpoints
from mlxserve.api.infill.errors import error_reply as llama_cpp_error
from mlxserve.api.ollama.endpoints import OllamaEndpoints
from mlxserve.api.ollama.errors import error_reply as ollama_error
from mlxserve.api.ollama.names import ModelNames, names_path
from mlxserve.api.openai.embeddings import EmbeddingEndpoints
from mlxserve.api.openai.endpoints import OpenAIEndpoints
from mlxserve.api.openai.errors import error_reply as openai_error
from mlxserve.api.openai.tokenize import TokenizeEndpoints
from mlxserve.api.realtime.session import RealtimeSession
from mlxserve.api.rerank.endpoints import RerankEndpoints
from mlxserve.api.responder import RawReply, Responder
from mlxserve.api.responses.conversations import is_conversation_path
from mlxserve.api.responses.conversations import label as conversation_label
from mlxserve.api.responses.endpoints import ResponsesEndpoints
from mlxserve.api.responses.files import FileInputs
from mlxserve.api.responses.socket import ResponsesSocket
from mlxserve.api.status import StatusEndpoint
from mlxserve.api.usage import UsageEndpoints
from mlxserve.api.websocket import OpenSockets, WebSocket
from mlxserve.keys.gate import KeyGate
from mlxserve.keys.store import keys_path
from mlxserve.mcp import config as mcp_config
from mlxserve.mcp.hub import McpHub
from mlxserve.protocol.errors import not_found
from mlxserve.service.chat import ChatService
from mlxserve.telemetry.activity import Activity

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
COMPLETION_PATHS = ("/v1/completions", "/completions")
MESSAGES_PATHS = ("/v1/messages", "/messages")
COUNT_TOKENS_PATHS = ("/v1/messages/count_tokens", "/messages/count_tokens")
ANTHROPIC_PATHS = MESSAGES_PATHS + COUNT_TOKENS_PATHS
RESPONSES_PATHS = ("/v1/responses", "/responses")
REALTIME_PATHS = ("/v1/realtime", "/realtime")  # a WebSocket only
COMPACT_PATHS = ("/v1/responses/compact", "/responses/compact")
RESPONSE_PREFIXES = ("/v1/responses/", "/responses/")  # + {id}, or {id}/input_items
EMBEDDINGS_PATHS = ("/v1/embeddings", "/embeddings")
TRANSCRIPTION_PATHS = ("/v1/audio/transcriptions", "/audio/transcriptions")
TRANSLATION_PATHS = ("/v1/audio/translations", "/audio/translations")
SPEECH_PATHS = ("/v1/audio/speech", "/audio/speech")
IMAGE_PATHS = ("/v1/images/generations", "/images/generations")
IMAGE_EDIT_PATHS = ("/v1/images/edits", "/images/edits")
MAX_IMAGE_UPLOAD_BYTES = 50 * 1024 * 1024  # an edit's image and mask (OpenAI's limit)
UPLOAD_OVERHEAD = 64 * 1024  # a multipart form's fields beside its file
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
SCORE_PATHS = ("/v1/score", "/score")
TOKENIZE_PATHS = ("/tokenize", "/v1/tokenize")
DETOKENIZE_PATHS = ("/detokenize", "/v1/detokenize")
HEALTH_PATHS = ("/health", "/v1/health")
MODELS_PATHS = ("/v1/models", "/models")
MODEL_PREFIXES = ("/v1/models/", "/models/")
LOAD_PATHS = ("/v1/models/load", "/models/load")
UNLOAD_PATHS = ("/v1/models/unload", "/models/unload")
PIN_PATHS = ("/v1/models/pin", "/models/pin")
ADAPTER_LOAD_PATHS = ("/v1/adapters/load", "/adapters/load")
ADAPTER_UNLOAD_PATHS = ("/v1/adapters/unload", "/adapters/unload")
INFILL_PATHS = ("/infill",)  # llama.cpp's
METRICS_PATHS = ("/metrics",)
STATUS_PATHS = ("/v1/status", "/status")
USAGE_PATHS = ("/v1/usage", "/usage")
KEYS_PATHS = ("/v1/keys", "/keys")
MCP_SERVERS_PATHS = ("/v1/mcp/servers", "/mcp/servers")
OPENAPI_PATHS = ("/openapi.json",)
# Ollama's API: its paths as Ollama has them (no /v1); errors in its shape under /api/.
OLLAMA_PREFIX = "/api/"
OLLAMA_VERSION_PATHS = ("/api/version",)
OLLAMA_TAGS_PATHS = ("/api/tags",)
OLLAMA_PS_PATHS = ("/api/ps",)
OLLAMA_DELETE_PATHS = ("/api/delete",)  # DELETE with a JSON body
OLLAMA_PULL_PATHS = ("/api/pull",)
OLLAMA_COPY_PATHS = ("/api/copy",)
OLLAMA_CREATE_PATHS = ("/api/create",)
# HEAD is answered where Ollama's clients probe: the root, the version, the model list.
HEAD_PATHS = ("/", *OLLAMA_VERSION_PATHS, *OLLAMA_TAGS_PATHS)
GET_PATHS = (
    HEALTH_PATHS
    + MODELS_PATHS
    + METRICS_PATHS
    + STATUS_PATHS
    + USAGE_PATHS
    + KEYS_PATHS
    + MCP_SERVERS_PATHS
    + OPENAPI_PATHS
    + OLLAMA_VERSION_PATHS
    + OLLAMA_TAGS_PATHS
    + OLLAMA_PS_PATHS
)
# Answered without an API key: what a load balancer polls, and the API's description
# (and the image links under LINK_PREFIX, whose random names are their access).
KEYLESS_PATHS = HEALTH_PATHS + OPENAPI_PATHS


def is_keyless(path: str) -> bool:
    return path in KEYLESS_PATHS or path.startswith(LINK_PREFIX)


# What only an admin key may ask (where the server has keys).
ADMIN_PATHS = (
    LOAD_PATHS
    + UNLOAD_PATHS
    + PIN_PATHS
    + ADAPTER_LOAD_PATHS
    + ADAPTER_UNLOAD_PATHS
    + METRICS_PATHS
    + KEYS_PATHS
    + MCP_SERVERS_PATHS
    + OLLAMA_PULL_PATHS
    + OLLAMA_DELETE_PATHS
    + OLLAMA_COPY_PATHS
    + OLLAMA_CREATE_PATHS
)

# Each group of POST paths and the endpoint that answers it (an attribute of Routes).
POST_ROUTES: tuple[tuple[tuple[str, ...], str], ...] = (
    (CHAT_PATHS, "openai.chat"),
    (COMPLETION_PATHS, "openai.completion"),
    (MESSAGES_PATHS, "anthropic.messages"),
    (COUNT_TOKENS_PATHS, "anthropic.count_tokens"),
    (RESPONSES_PATHS, "responses.create"),
    (COMPACT_PATHS, "responses.compact"),
    (EMBEDDINGS_PATHS, "embeddings.embeddings"),
    (RERANK_PATHS, "rerank.rerank"),
    (SCORE_PATHS, "rerank.score"),
    (TRANSCRIPTION_PATHS, "transcription.transcriptions"),
    (TRANSLATION_PATHS, "transcription.translations"),
    (SPEECH_PATHS, "speech.speech"),
    (IMAGE_PATHS, "images.generations"),
    (IMAGE_EDIT_PATHS, "images.edits"),
    (LOAD_PATHS, "openai.load_model"),
    (UNLOAD_PATHS, "openai.unload_model"),
    (PIN_PATHS, "openai.pin_model"),
    (ADAPTER_LOAD_PATHS, "openai.load_adapter"),
    (ADAPTER_UNLOAD_PATHS, "openai.unload_adapter"),
    (TOKENIZE_PATHS, "tokenizer.tokenize"),
    (INFILL_PATHS, "infill.infill"),
    (DETOKENIZE_PATHS, "tokenizer.detokenize"),
    (("/api/chat",), "ollama.chat"),
    (("/api/generate",), "ollama.generate"),
    (("/api/show",), "ollama.show"),
    (("/api/embed",), "ollama.embed"),
    (("/api/embeddings",), "ollama.embeddings"),
    (OLLAMA_PULL_PATHS, "ollama.pull"),
    (OLLAMA_COPY_PATHS, "ollama.copy"),
    (OLLAMA_CREATE_PATHS, "ollama.create"),
)

# A POST endpoint: (request body, the connection) -> a JSON reply, a whole reply of
# another type, or None once streamed.
Endpoint = Callable[[bytes, Responder], dict | RawReply | None]
# A WebSocket session: (the open socket, what answers each message as a request of its own)
SocketSession = Callable[[WebSocket, Callable[[], AbstractContextManager[None]]], None]


@dataclass
class Routes:
    service: ChatService
    activity: Activity = field(default_factory=Activity)
    openai: OpenAIEndpoints = field(init=False)
    anthropic: AnthropicEndpoints = field(init=False)
    responses: ResponsesEndpoints = field(init=False)
    tokenizer: TokenizeEndpoints = field(init=False)
    embeddings: EmbeddingEndpoints = field(init=False)
    rerank: RerankEndpoints = field(init=False)
    transcription: TranscriptionEndpoints = field(init=False)
    speech: SpeechEndpoints = field(init=False)
    images: ImageEndpoints = field(init=False)
    image_links: ImageLinks = field(default_factory=ImageLinks)
    status: StatusEndpoint = field(init=False)
    infill: InfillEndpoints = field(init=False)
    ollama: OllamaEndpoints = field(init=False)
    post: dict[str, Endpoint] = field(init=False)
    sockets: dict[str, SocketSession] = field(init=False)  # GET paths a WebSocket opens on
    open_sockets: OpenSockets = field(default_factory=OpenSockets)
    batch_keeper: BatchKeeper = field(init=False)
    batches: BatchRoutes = field(init=False)
    keys: KeyGate = field(init=False)
    usage: UsageEndpoints = field(init=False)
    mcp: McpHub = field(init=False)

    def __post_init__(self):
        config = self.service.config
        self.keys = KeyGate(keys_path(config.keys_db), config.api_key, config.keys_db is not None)
        self.usage = UsageEndpoints(self.keys)
        self.mcp = McpHub(
            mcp_config.load(config.mcp_config) if config.mcp_config else (),
            config.mcp_call_timeout,
            config.mcp_max_output,
        )
        self.openai = OpenAIEndpoints(self.service)
        self.anthropic = AnthropicEndpoints(self.service, self.mcp)
        # the batch keeper (made below) holds the files a Responses request may name
        self.responses = ResponsesEndpoints(
            self.service, FileInputs(lambda: self.batch_keeper.store()), self.mcp
        )
        self.tokenizer = TokenizeEndpoints(self.service)
        self.embeddings = EmbeddingEndpoints(self.service)
        self.rerank = RerankEndpoints(self.service)
        self.transcription = TranscriptionEndpoints(self.service)
        self.speech = SpeechEndpoints(self.service)
        self.images = ImageEndpoints(self.service, self.image_links)
        self.infill = InfillEndpoints(self.service)
        self.ollama = OllamaEndpoints(self.service, ModelNames(names_path(config.model_names_db)))
        self.post = {
            path: attrgetter(endpoint)(self) for paths, endpoint in POST_ROUTES for path in paths
        }
        self.sockets = {path: self._responses_socket for path in RESPONSES_PATHS}
        self.sockets.update({path: self._realtime_socket for path in REALTIME_PATHS})
        # Batch lines run through the endpoints a client's request of their kind takes.
        lines = {path: self.post[path] for path in (*BATCH_ENDPOINTS, MESSAGES)}
        outputs: dict[str, Outputs] = {"openai": output_files}
        keeper = BatchKeeper(
            self.service.config, lines, self.errors, outputs, self.keys, self.activity.token
        )
        self.batch_keeper = keeper
        self.status = StatusEndpoint(
            self.service, self.activity, keeper, self.keys, self.open_sockets, self.mcp
        )
        self.batches = BatchRoutes(
            FileEndpoints(keeper), BatchEndpoints(keeper), MessageBatchEndpoints(keeper)
        )

    def _responses_socket(self, socket_: WebSocket, turn) -> None:
        ResponsesSocket(self.responses, socket_, turn, openai_error).serve()

    def _realtime_socket(self, socket_: WebSocket, turn) -> None:
        RealtimeSession(self.service, socket_, turn).serve()

    def body_limit(self, path: str) -> int:
        """The largest body a POST to `path` may send: an audio upload's is the audio
        limit's (with room for the form's fields), every other the body limit."""
        config = self.service.config
        if path in TRANSCRIPTION_PATHS + TRANSLATION_PATHS:
            return max(config.max_body_bytes, config.max_audio_bytes + UPLOAD_OVERHEAD)
        if path in IMAGE_EDIT_PATHS:
            return max(config.max_body_bytes, MAX_IMAGE_UPLOAD_BYTES + UPLOAD_OVERHEAD)
        if batch_paths.is_upload_path(path):
            batch_limit = config.max_batch_file_bytes + UPLOAD_OVERHEAD
            return max(config.max_body_bytes, batch_limit)
        return config.max_body_bytes

    def endpoint(self, path: str) -> str:
        """The path as a metrics label: a known path, or "other" (labels stay bounded)."""
        if path in self.post or path in GET_PATHS or path in OLLAMA_DELETE_PATHS:
            return path
        if batch_paths.is_batch_path(path):
            return batch_paths.label(path)
        if is_conversation_path(path):
            return conversation_label(path)
        if path.startswith(LINK_PREFIX):
            return LINK_PREFIX + "{name}"
        if path.startswith(RESPONSE_PREFIXES):
            items = path.endswith("/input_items")
            return "/v1/responses/{id}/input_items" if items else "/v1/responses/{id}"
        return "/v1/models/{model}" if path.startswith(MODEL_PREFIXES) else "other"

    def models(self, headers: Message, query: str) -> dict:
        """GET /v1/models: OpenAI's list, or a page of Anthropic's where the request
        carries anthropic-version."""
        if speaks_anthropic(headers):
            return model_page(self.service.models(), query)
        return self.openai.models()

    def model(self, headers: Message, model_id: str) -> dict:
        """GET /v1/models/{id}: OpenAI's entry, or Anthropic's ModelInfo."""
        entry = self.openai.model(model_id)
        return model_info(entry) if speaks_anthropic(headers) else entry

    def stored_response(self, method: str, path: str, query: str) -> dict:
        """GET or DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items."""
        response_id, _, rest = path.split("/responses/", 1)[1].partition("/")
        if method == "GET" and rest == "input_items":
            return self.responses.input_items(response_id, query)
        if rest:
            raise not_found(f"Unknown path: {path}", code="unknown_url")
        if method == "DELETE":
            return self.responses.delete(response_id)
        return self.responses.retrieve(response_id)

    @staticmethod
    def errors(path: str, headers: Message | None = None) -> ErrorRenderer:
        """Errors on Anthropic's paths in its shape (and on the model list's, asked with
        anthropic-version), on llama.cpp's /infill in llama.cpp's, on Ollama's /api/ in
        Ollama's; everything else in OpenAI's."""
        if path in INFILL_PATHS:
            return llama_cpp_error
        if path.startswith(OLLAMA_PREFIX):
            return ollama_error
        anthropic = path in ANTHROPIC_PATHS or batch_paths.is_anthropic_path(path)
        models = path in MODELS_PATHS or path.startswith(MODEL_PREFIXES)
        if models and headers is not None and speaks_anthropic(headers):
            anthropic = path not in LOAD_PATHS + UNLOAD_PATHS + PIN_PATHS
        return anthropic_error if anthropic else openai_error
