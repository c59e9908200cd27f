"""Server-wide settings, each declared once (see settings.py), filled from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mlxserve.mcp.config import checked as mcp_config_file
from mlxserve.settings import (
    LoraOption,
    chat_template,
    json_object,
    lora_option,
    name_pair,
    positive_float,
    positive_int,
    setting,
)

# The groups settings are listed in, in this order.
MODELS = "Models"
SAMPLING = "Sampling defaults (a request's own values win)"
SERVER = "Server"
BATCHING = "Batching"
SPECULATION = "Speculation"
CACHE = "Prompt cache and KV caches"
MEMORY = "Memory"
MEDIA = "Images, video and audio"
RESPONSES = "Responses API"
MCP = "MCP tools"
BATCHES = "Batch API"
DISTRIBUTED = "Several Macs (under mlx.launch)"
CONFIG_FILE = "A --config file's [[models]]"
GROUPS = (
    MODELS,
    SAMPLING,
    SERVER,
    BATCHING,
    SPECULATION,
    CACHE,
    MEMORY,
    MEDIA,
    RESPONSES,
    MCP,
    BATCHES,
    DISTRIBUTED,
)


@dataclass(frozen=True)
class SamplingDefaults:
    """Used when a request leaves a sampling field out."""

    temperature: float = setting(
        0.0, flag="--temp", group=SAMPLING, help="the temperature (0: greedy)"
    )
    top_p: float = setting(1.0, group=SAMPLING, help="nucleus sampling's probability mass")
    top_k: int = setting(0, group=SAMPLING, help="sample from this many likeliest (0: all)")
    min_p: float = setting(
        0.0, group=SAMPLING, help="drop tokens less likely than this share of the likeliest"
    )
    max_tokens: int = setting(512, group=SAMPLING, help="max_tokens of a request without one")


@dataclass(frozen=True)
class ModelSettings:
    """A served model (a --model, or an entry of --config) and what it sets for itself;
    None: the server-wide setting."""

    model: str = setting(
        "demo", group=CONFIG_FILE, help="a hub repo id or a folder (relative to the file)"
    )
    name: str | None = setting(
        None, group=CONFIG_FILE, help="the name clients use (default: model)"
    )
    aliases: tuple[str, ...] = setting(
        (), group=CONFIG_FILE, help='more names; one ending in "*" matches names it begins'
    )
    chat_template: str | None = None
    chat_template_args: dict | None = None
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    draft_model: str | None = None
    max_context: int | None = None
    pin: bool | None = None

    @property
    def served_name(self) -> str:
        return self.name or self.model


# What a model's settings may set for it instead of the server-wide value.
PER_MODEL = (
    "chat_template",
    "chat_template_args",
    "reasoning_parser",
    "tool_parser",
    "max_context",
    "pin",
)


@dataclass(frozen=True)
class ServerConfig:
    """Every server-wide setting, each declared once: its type, default, help and group."""

    # --model and --config models, in order: all resident, the first the default
    models: tuple[ModelSettings, ...] = setting(
        (ModelSettings("demo"),),
        flag="--model",
        many="repeat",
        parse=ModelSettings,
        group=MODELS,
        shown_default="`demo`",
        help="Hugging Face repo id (downloaded when online, else taken from the HF cache) or a local mlx-lm or mlx-vlm folder; the name given is the name clients use. Repeatable: every model named is loaded at start and kept resident; the first is the default for requests without `model`",
    )
    config_file: Path | None = setting(
        None,
        flag="--config",
        parse=Path,
        group=MODELS,
        help="a TOML file of more models to serve, each with its own settings",
    )
    pin: bool = setting(
        False, group=MODELS, help="the `--model` models are never unloaded, for memory or when idle"
    )
    idle_unload_seconds: float | None = setting(
        None,
        parse=positive_float,
        group=MODELS,
        shown_default="never",
        help="unload a model unused this long (its memory freed, MLX's cache cleared); the next request for it loads it again",
    )
    # (client name, served model) pairs; a name ending in "*" matches any name it prefixes
    model_aliases: tuple[tuple[str, str], ...] = setting(
        (),
        flag="--model-alias",
        many="repeat",
        parse=name_pair,
        metavar="NAME=MODEL",
        group=MODELS,
        help="`NAME=MODEL` (repeatable): requests for `NAME` are served by `MODEL` (`default` is the served model); a `NAME` ending in `*` matches every name it begins, e.g. `'claude-*=default'` for Claude Code. An exact name wins over a prefix, a longer prefix over a shorter one",
    )
    model_dirs: tuple[Path, ...] = setting(
        (),
        flag="--model-dir",
        many="repeat",
        parse=Path,
        group=MODELS,
        help="a folder whose model subfolders clients may load by name (repeatable)",
    )
    # The Hugging Face cache and `mlxserve pull --quantize`'s folder: listed in /v1/models
    # and loadable on request (False: only the --model and --model-dir models are).
    cached_models: bool = setting(
        True,
        flag="--no-cached-models",
        group=MODELS,
        help="neither list nor load the HF cache's models and `mlxserve pull --quantize`'s",
    )
    max_context: int | None = setting(
        None,
        parse=positive_int,
        group=MODELS,
        shown_default="the model's",
        help="most tokens one request may take, prompt and output together; the default is the context length in the model's `config.json` (`max_position_embeddings` and kin), which this may only lower",
    )
    chat_template: str | None = setting(
        None,
        parse=chat_template,
        group=MODELS,
        help="a Jinja chat template (text with `{{` or `{%`), or a file holding one, replacing the model's; a path that names no file stops the server with an error",
    )
    chat_template_args: dict = setting(
        factory=dict,
        parse=json_object,
        group=MODELS,
        shown_default="`{}`",
        help="JSON object passed to the chat template (e.g. `'{\"enable_thinking\": false}'`); a request's `chat_template_kwargs` override it",
    )
    trust_remote_code: bool = setting(False, group=MODELS, help="allow tokenizers with custom code")
    adapter_path: str | None = setting(
        None,
        group=MODELS,
        help="one LoRA adapter applied to every request for the default (first) model; to serve several adapters side by side on one base, use --lora",
    )
    lora: tuple[LoraOption, ...] = setting(
        (),
        many="repeat",
        parse=lora_option,
        metavar="NAME=PATH[@MODEL]",
        group=MODELS,
        help="`NAME=PATH[@MODEL]` (repeatable): serve the LoRA or DoRA adapter in folder PATH (written by `mlx_lm.lora`, or a PEFT folder) as the model `NAME`, on the served model `MODEL` (default: the first). Rows under different adapters and the base decode in one batch; the base is never fused or reloaded. Adapters can also be loaded at runtime (`POST /v1/adapters/load`)",
    )
    max_loaded_adapters: int = setting(
        8,
        parse=positive_int,
        group=MODELS,
        help="adapters kept in memory per model; beyond it (or the memory budget) the least recently used idle, unpinned one is set free, and read again from its folder when next asked for",
    )
    text_only: bool = setting(
        False,
        group=MODELS,
        help="serve vision-language checkpoints that mlx-lm also loads (Qwen3.5 and 3.6 are published this way) as text models, images refused with a 400; without it they are served through mlx-vlm, batched like text, images taken, drafting with their MTP head all the same",
    )
    reasoning_format: str = setting(
        "separate",
        choices="reasoning formats",
        group=MODELS,
        help="`separate`, `think-tags`, `details` or `hidden`; the OpenAI dialect only: Anthropic replies always carry reasoning as `thinking` blocks",
    )
    reasoning_parser: str | None = setting(
        None,
        choices="reasoning parsers",
        group=MODELS,
        shown_default="detected",
        help="`think`, `none` or `harmony`: override the reasoning format detected from the tokenizer",
    )
    tool_parser: str | None = setting(
        None,
        choices="tool parsers",
        group=MODELS,
        shown_default="detected",
        help="a tool-call format name, or `harmony` (`mlxserve --help` lists them)",
    )
    tool_call_grammar: str = setting(
        "auto",
        choices=("auto", "off"),
        group=MODELS,
        help='`auto`: under `tool_choice: auto` a call the model opens follows its tool\'s schema (the text before it stays free); `off`: only forced calls are constrained. A request can turn it off with `tool_call_grammar: "off"`',
    )
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    host: str = setting("127.0.0.1", group=SERVER, help="the address to listen on")
    port: int = setting(8080, group=SERVER, help="0 picks a free port")
    allowed_origins: tuple[str, ...] = setting(
        ("*",),
        many="comma",
        group=SERVER,
        help="comma-separated CORS origins; a browser request (it carries `Origin`) from another origin is a 403",
    )
    # Host header names answered; None: loopback names when bound to loopback, else any
    allowed_hosts: tuple[str, ...] | None = setting(
        None,
        many="comma",
        group=SERVER,
        shown_default="loopback names",
        help="`Host` header names the server answers to (comma-separated, or `*`). Bound to loopback, only `localhost`, `*.localhost`, loopback addresses and `host.docker.internal` (a page's DNS-rebinding name is a 403); bound to anything else, any name",
    )
    read_timeout: float = setting(
        60.0,
        group=SERVER,
        help="seconds a client may stay silent while sending a request, or idle between requests on a kept-alive connection, before it is let go (a 408 for an unfinished body); also the deadline for a request's whole head, and the least time its body is given",
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024,
        group=SERVER,
        shown_default="16 MiB",
        help="larger request bodies get 413 without being read",
    )
    api_key: str | None = setting(
        None,
        env="MLXSERVE_API_KEY",
        group=SERVER,
        help="require `Authorization: Bearer KEY` or `x-api-key: KEY` on every `/v1` call",
    )
    keys_db: Path | None = setting(
        None,
        parse=Path,
        group=SERVER,
        shown_default="`keys.sqlite` in the cache folder, once `mlxserve keys create` makes it",
        help="the SQLite file of API keys (each with its models, rate limits and quota) and their usage, kept by `mlxserve keys`; once it holds a key, every `/v1` call needs one (see Sharing a server)",
    )
    # signs thinking and seals reasoning and compactions; None: the install's key file
    secret_key: str | None = setting(
        None,
        env="MLXSERVE_SECRET_KEY",
        group=SERVER,
        help="the key that signs thinking blocks and seals reasoning and compactions (any text; give every server behind one name the same one); default: a random key made once per install, `secret.key` in the cache folder (`~/.cache/mlxserve`), readable by its owner only",
    )
    websocket_idle_timeout: float = setting(
        900.0,
        group=SERVER,
        help="seconds a WebSocket session (Responses over a socket, a Realtime session) may stay silent between messages before the server closes it (1001, `going away`); clients reconnect",
    )
    keepalive_seconds: float = setting(
        5.0,
        group=SERVER,
        help="an SSE comment (`: keepalive`) goes out when a stream has been silent this long",
    )
    log_level: str = setting(
        "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), group=SERVER, help="log detail"
    )
    max_concurrent: int = setting(
        32,
        parse=positive_int,
        group=BATCHING,
        help="most sequences decoding together; more wait for a free slot",
    )
    max_queue: int = setting(
        256,
        parse=positive_int,
        group=BATCHING,
        help="most sequences waiting beyond those; a request that would exceed it gets 503 with `Retry-After`",
    )
    prefill_chunk: int = setting(
        256,
        parse=positive_int,
        group=BATCHING,
        help="prompt tokens processed per decode step of the running streams",
    )
    draft_model: str | None = setting(
        None,
        group=SPECULATION,
        help="a draft model for speculative decoding, or an EAGLE-3 or DFlash drafter (mlx-vlm's and z-lab's formats)",
    )
    num_draft_tokens: int = setting(
        3,
        group=SPECULATION,
        help="tokens drafted per sequence and step by a draft model, an EAGLE-3 drafter or "
        "an MTP head (a DFlash drafter guesses its block size less one)",
    )
    speculation: str = setting(
        "auto",
        choices=("auto", "on", "off"),
        group=SPECULATION,
        help="`auto`, `on` or `off`: draft tokens from the context (prompt lookup) and verify them in the batch's decode step; `auto` turns it on where this device verifies a draft for less than the steps it saves, measured when the model loads. With a --draft-model, `auto` lets each sequence draft only what this device's measured costs pay for at its acceptance (nothing but a try now and then where its guesses miss); `on` and `off` draft for every sequence each step",
    )
    max_draft: int = setting(
        8,
        group=SPECULATION,
        help="the most tokens drafted per sequence and step (`0`: no speculation)",
    )
    mtp: str = setting(
        "auto",
        choices=("auto", "on", "off"),
        group=SPECULATION,
        help="`auto`, `on` or `off`: draft with the multi-token-prediction head a checkpoint carries (Qwen3.5/3.6 and Qwen3-Next's `mtp.*`, GLM-4.5+ and DeepSeek-V3's layer after the last), verified in the batch's decode step; `auto` where this device verifies the drafts for less than half the steps they can save, measured when the model loads; `off` does not read the head",
    )
    prompt_cache_size: int = setting(
        32, group=CACHE, help="token prefixes kept in memory for reuse"
    )
    prompt_cache_bytes: int | None = setting(
        None,
        parse=int,
        group=CACHE,
        shown_default="no limit",
        help="byte budget of the prefixes in memory, running requests' KV caches included; the least recently used go first",
    )
    prompt_cache_dir: Path | None = setting(
        None,
        parse=Path,
        group=CACHE,
        help="the disk tier: evicted prefixes (and, at shutdown, all of them) are kept here as safetensors and reused, also after a restart",
    )
    prompt_cache_disk_gb: float = setting(
        10.0,
        group=CACHE,
        help="size cap of `--prompt-cache-dir`; the least recently used files go first",
    )
    kv_bits: int | None = setting(
        None,
        parse=int,
        choices=(4, 8),
        group=CACHE,
        help="`4` or `8`: quantize the KV caches (the running batch, the prompt cache and its disk tier) for about 3.6x or 1.9x less memory per token (bfloat16, groups of 64)",
    )
    kv_group_size: int = setting(
        64,
        choices=(32, 64, 128),
        group=CACHE,
        help="`32`, `64` or `128`: values sharing one scale and bias in the quantized cache; it must divide the model's head size (a clear error at start-up otherwise)",
    )
    memory_budget_gb: float | None = setting(
        None,
        parse=positive_float,
        group=MEMORY,
        shown_default="the device's recommended working set (Metal), else MLX's memory limit",
        help="memory for the weights of every resident model and every KV cache: a request whose KV caches (prompt + `max_tokens`, each of its `n` choices) could never fit beside its model's weights is a 400 `insufficient_memory`; one that does not fit beside the running batches waits; loading a model unloads idle ones, least recently used first, when its weights would not fit; the prompt cache keeps what is left",
    )
    cache_limit_gb: float | None = setting(
        None,
        parse=float,
        group=MEMORY,
        shown_default="a tenth of the memory budget, or MLX's own limit if lower",
        help="limit of MLX's buffer cache (freed memory kept for reuse); on Apple silicon the model's memory is also wired up to the GPU's recommended working set while a batch runs (as mlx-lm does), and unloading a model frees it and empties the cache",
    )
    # local image files may be read from these (and model_dirs)
    image_dirs: tuple[Path, ...] = setting(
        (),
        flag="--image-dir",
        many="repeat",
        parse=Path,
        group=MEDIA,
        help="a folder whose image, video and audio files requests may name by path (repeatable); `--model-dir` folders are allowed too, nothing else",
    )
    max_image_bytes: int = setting(
        20 * 1024 * 1024,
        parse=positive_int,
        group=MEDIA,
        shown_default="20 MiB",
        help="largest image a request may send or point to (a 400 beyond it)",
    )
    max_audio_bytes: int = setting(
        25 * 1024 * 1024,  # OpenAI's limit
        parse=positive_int,
        group=MEDIA,
        help="largest audio file a transcription may upload, or a chat request may send or point to",
    )
    max_audio_seconds: float = setting(
        120.0,
        parse=positive_float,
        group=MEDIA,
        help="longest audio clip a chat request may send (a 400 beyond it); the model's processor may read less of it (Gemma's: its first 30 s)",
    )
    max_video_bytes: int = setting(
        100 * 1024 * 1024,
        parse=positive_int,
        group=MEDIA,
        shown_default="100 MiB",
        help="largest video a chat request may send or point to (a 400 beyond it)",
    )
    max_video_seconds: float = setting(
        600.0,
        parse=positive_float,
        group=MEDIA,
        help="longest video a chat request may send (a 400 beyond it)",
    )
    video_fps: float = setting(
        2.0,
        parse=positive_float,
        group=MEDIA,
        help="frames sampled from each second of a video where the request names no rate (`video_url.fps`)",
    )
    max_video_fps: float = setting(
        8.0,
        parse=positive_float,
        group=MEDIA,
        help="the highest sampling rate a request may ask for (a 400 beyond it)",
    )
    max_video_frames: int = setting(
        32,
        parse=positive_int,
        group=MEDIA,
        help="frames sampled from one video at most: a longer clip is sampled more sparsely (each frame costs the model's tokens: Qwen2.5-VL's, up to 384 a pair of frames)",
    )
    realtime_transcription_model: str | None = setting(
        None,
        group=MEDIA,
        shown_default="the first transcription model served",
        help="the model a Realtime session hears audio with (a served name; a session may name another in `audio.input.transcription.model`)",
    )
    realtime_speech_model: str | None = setting(
        None,
        group=MEDIA,
        shown_default="the first speech model served",
        help="the model a Realtime session speaks with (a served name)",
    )
    max_image_pixels: int = setting(
        2048 * 2048,
        parse=positive_int,
        group=MEDIA,
        shown_default="2048x2048",
        help="larger images are downscaled to this many pixels, aspect kept, before the model's processor sees them",
    )
    image_fetch_timeout: float = setting(
        10.0,
        group=MEDIA,
        help="seconds allowed for fetching an image, video or audio URL, the whole fetch (a server trickling bytes is cut off)",
    )
    allow_local_image_urls: bool = setting(
        False,
        group=MEDIA,
        help="image, video and audio URLs may name loopback and private addresses (a media server on this machine or the LAN); link-local and cloud metadata addresses are refused whatever this says",
    )
    responses_store_size: int = setting(
        1000,
        group=RESPONSES,
        help="most Responses API responses kept in memory for `previous_response_id`, retrieval and `input_items` (`0`: none); the least recently used go first",
    )
    responses_store_mb: float = setting(
        256.0,
        parse=positive_float,
        group=RESPONSES,
        help="most megabytes (counted as JSON) the stored responses take",
    )
    mcp_config: Path | None = setting(
        None,
        parse=mcp_config_file,
        group=MCP,
        help='the MCP servers whose tools requests may use, as `{"mcpServers": {name: {"command", "args", "env"} or {"url", "headers"}}}` (the format Claude Desktop and editors share); connected at start-up, restarted when they fail (docs/mcp.md)',
    )
    mcp_allow_urls: tuple[str, ...] = setting(
        (),
        flag="--mcp-allow-url",
        many="repeat",
        group=MCP,
        help="a glob a request's MCP `server_url` must match, e.g. `'http://127.0.0.1:*'` (repeatable; none by default: requests use --mcp-config's servers only); link-local and cloud metadata addresses are refused whatever matches",
    )
    mcp_call_timeout: float = setting(
        60.0,
        parse=positive_float,
        group=MCP,
        help="seconds an MCP tool call may take; then the model is told it timed out",
    )
    mcp_max_output: int = setting(
        100_000,
        parse=positive_int,
        group=MCP,
        help="most characters of an MCP tool's output the model is given; the rest is cut, and the cut said",
    )
    batch_db: Path | None = setting(
        None,
        parse=Path,
        group=BATCHES,
        shown_default="`batches.sqlite` in the cache folder",
        help="the SQLite file of the server's durable state: uploaded files, batch jobs and their results, and conversations (kept across restarts; batch jobs run on one server at a time)",
    )
    model_names_db: Path | None = setting(
        None,
        parse=Path,
        group=MODELS,
        shown_default="`ollama-names.sqlite` in the cache folder",
        help="the SQLite file of the model names Ollama's `/api/copy` and `/api/create` make (each a model with its own system prompt, parameters or adapter), kept across restarts",
    )
    max_batch_file_bytes: int = setting(
        200 * 1024 * 1024,  # OpenAI's limit
        parse=positive_int,
        group=BATCHES,
        shown_default="200 MiB",
        help="largest file `/v1/files` takes, and largest Message Batches request body",
    )
    max_batch_lines: int = setting(
        50_000,  # OpenAI's limit
        parse=positive_int,
        group=BATCHES,
        help="most requests in one batch",
    )
    distributed: str | None = setting(
        None,
        choices="distributed modes",
        group=DISTRIBUTED,
        shown_default="tensor where supported",
        help="under `mlx.launch`: `tensor` (every layer split across the machines) or `pipeline` (each machine a run of whole layers)",
    )
    distributed_timeout: float = setting(
        30.0,
        parse=positive_float,
        group=DISTRIBUTED,
        help="under `mlx.launch`: seconds without a heartbeat after which a rank has failed (rank 0 then answers 503 and exits)",
    )

    @property
    def model(self) -> str:
        """The default model's name: the first served model's."""
        return self.models[0].served_name

    def for_model(self, settings: ModelSettings | None) -> ServerConfig:
        """The configuration one model is served with: its own settings over these."""
        if settings is None:
            return self
        own = {key: getattr(settings, key) for key in PER_MODEL}
        return replace(self, **{key: value for key, value in own.items() if value is not None})
