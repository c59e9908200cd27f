"""Server-wide settings, each declared once (see settings.py), filled from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mlxserve.settings import (
    chat_template,
    json_object,
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
MEDIA = "Images and audio"
RESPONSES = "Responses API"
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
        shown_default="demo",
        help="hub repo id or local folder; 'demo' (default) serves SmolLM2-135M-Instruct. "
        "Repeatable: every one is loaded at start and kept resident; the first is the default",
    )
    config_file: Path | None = setting(
        None,
        flag="--config",
        parse=Path,
        group=MODELS,
        help="a TOML file of models to serve (after the --model ones) with their own "
        "names, aliases, chat template, parsers, draft model, context limit and pinning",
    )
    pin: bool = setting(
        False, group=MODELS, help="never unload the --model models (for memory or when idle)"
    )
    idle_unload_seconds: float | None = setting(
        None,
        parse=positive_float,
        group=MODELS,
        help="unload a model idle this long (default: models stay until memory is needed)",
    )
    # (client name, served model) pairs; a name ending in "*" matches any name it prefixes
    model_aliases: tuple[tuple[str, str], ...] = setting(
        (),
        flag="--model-alias",
        many="repeat",
        parse=name_pair,
        metavar="NAME=MODEL",
        group=MODELS,
        help="answer requests for NAME with MODEL (repeatable); a NAME ending in '*' matches "
        "every name it begins, e.g. 'claude-*=demo' for Claude Code",
    )
    model_dirs: tuple[Path, ...] = setting(
        (),
        flag="--model-dir",
        many="repeat",
        parse=Path,
        group=MODELS,
        help="a folder whose models clients may load (repeatable)",
    )
    # The Hugging Face cache and `mlxserve pull --quantize`'s folder: listed in /v1/models
    # and loadable on request (False: only the --model and --model-dir models are).
    cached_models: bool = setting(
        True,
        flag="--no-cached-models",
        group=MODELS,
        help="neither list nor load the models in the Hugging Face cache and those "
        "`mlxserve pull --quantize` made; only --model and --model-dir ones",
    )
    max_context: int | None = setting(
        None,
        parse=positive_int,
        group=MODELS,
        help="most tokens a request may take, prompt and output together (default: the "
        "context length in the model's config; this may only lower it)",
    )
    chat_template: str | None = setting(
        None,
        parse=chat_template,
        group=MODELS,
        help="a Jinja chat template, or a file holding one",
    )
    chat_template_args: dict = setting(
        factory=dict,
        parse=json_object,
        group=MODELS,
        shown_default="{}",
        help="JSON object passed to the chat template",
    )
    trust_remote_code: bool = setting(
        False, group=MODELS, help="let transformers run a checkpoint's own tokenizer code"
    )
    adapter_path: str | None = setting(
        None, group=MODELS, help="LoRA adapters to apply to the served model"
    )
    text_only: bool = setting(
        False,
        group=MODELS,
        help="serve vision-language checkpoints that mlx-lm also loads (Qwen3.5/3.6) as text "
        "models: batched, drafting with their MTP head, without image input",
    )
    reasoning_format: str = setting(
        "separate",
        choices="reasoning formats",
        group=MODELS,
        help="reasoning as reasoning_content fields (separate), inline <think> tags, "
        "a <details> block, or hidden",
    )
    reasoning_parser: str | None = setting(
        None,
        choices="reasoning parsers",
        group=MODELS,
        help="override the reasoning tags detected from the tokenizer",
    )
    tool_parser: str | None = setting(
        None,
        choices="tool parsers",
        group=MODELS,
        help="override the tool-call format detected from the chat template",
    )
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    host: str = setting("127.0.0.1", group=SERVER, help="the address to listen on")
    port: int = setting(8080, group=SERVER, help="0 picks a free port")
    allowed_origins: tuple[str, ...] = setting(
        ("*",), many="comma", group=SERVER, help="comma-separated CORS origins"
    )
    # Host header names answered; None: loopback names when bound to loopback, else any
    allowed_hosts: tuple[str, ...] | None = setting(
        None,
        many="comma",
        group=SERVER,
        help="comma-separated Host header names to answer, or '*' (default: loopback names "
        "and host.docker.internal when bound to loopback, any name otherwise)",
    )
    read_timeout: float = setting(
        60.0,
        group=SERVER,
        help="seconds a client may stay silent while sending a request (or idle between "
        "requests on a kept-alive connection) before it is let go",
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024, group=SERVER, help="largest request body accepted"
    )
    api_key: str | None = setting(
        None,
        env="MLXSERVE_API_KEY",
        group=SERVER,
        help="require this key (also MLXSERVE_API_KEY)",
    )
    # signs thinking and seals reasoning and compactions; None: the install's key file
    secret_key: str | None = setting(
        None,
        env="MLXSERVE_SECRET_KEY",
        group=SERVER,
        help="sign thinking blocks and seal reasoning and compactions with this key (also "
        "MLXSERVE_SECRET_KEY; the same on servers behind one name); default: a random key "
        "made once per install in the cache folder",
    )
    keepalive_seconds: float = setting(
        5.0, group=SERVER, help="send an SSE comment when a stream has been silent this long"
    )
    log_level: str = setting(
        "INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), group=SERVER, help="log detail"
    )
    max_concurrent: int = setting(
        32, parse=positive_int, group=BATCHING, help="most sequences decoding together"
    )
    max_queue: int = setting(
        256,
        parse=positive_int,
        group=BATCHING,
        help="most sequences waiting for a slot; beyond it requests get 503 with Retry-After",
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
        help="a draft model for speculative decoding, or an EAGLE-3 drafter (mlx-vlm's format)",
    )
    num_draft_tokens: int = setting(
        3,
        group=SPECULATION,
        help="tokens drafted per sequence and step by a draft model, an EAGLE-3 drafter or "
        "an MTP head",
    )
    speculation: str = setting(
        "auto",
        choices=("auto", "on", "off"),
        group=SPECULATION,
        help="draft tokens from the context (prompt lookup) and verify them in the decode "
        "step; auto: only where this device verifies a draft for less than it saves",
    )
    max_draft: int = setting(
        8,
        group=SPECULATION,
        help="the most tokens drafted per sequence and step (0: no speculation)",
    )
    mtp: str = setting(
        "auto",
        choices=("auto", "on", "off"),
        group=SPECULATION,
        help="draft with the MTP head a checkpoint carries (Qwen's mtp.*, GLM-4.5+ and "
        "DeepSeek-V3's layer after the last), --num-draft-tokens per step; auto: only where "
        "this device verifies the drafts for less than they can save; off: not loaded",
    )
    prompt_cache_size: int = setting(32, group=CACHE, help="prompt prefixes kept in memory")
    prompt_cache_bytes: int | None = setting(
        None,
        parse=int,
        group=CACHE,
        help="byte budget of the prompt prefixes in memory, running requests' caches "
        "included (least recently used go first)",
    )
    prompt_cache_dir: Path | None = setting(
        None,
        parse=Path,
        group=CACHE,
        help="keep evicted prompt prefixes (and all of them at shutdown) in this folder, "
        "reused after a restart",
    )
    prompt_cache_disk_gb: float = setting(
        10.0, group=CACHE, help="size cap of --prompt-cache-dir (oldest used go first)"
    )
    kv_bits: int | None = setting(
        None,
        parse=int,
        choices=(4, 8),
        group=CACHE,
        help="quantize the KV caches (running requests, prompt cache, disk tier) to this "
        "many bits: about 3.6x (4) or 2x (8) less memory per token",
    )
    kv_group_size: int = setting(
        64,
        choices=(32, 64, 128),
        group=CACHE,
        help="values sharing one scale in the quantized KV cache",
    )
    memory_budget_gb: float | None = setting(
        None,
        parse=positive_float,
        group=MEMORY,
        help="memory for the weights and every KV cache (running requests, then the "
        "prompt cache); a request that does not fit waits, one that never can is a 400 "
        "(default: the device's recommended working set)",
    )
    cache_limit_gb: float | None = setting(
        None,
        parse=float,
        group=MEMORY,
        help="limit of MLX's buffer cache (memory kept for reuse after arrays are freed; "
        "default: a tenth of the memory budget, or MLX's own limit if lower)",
    )
    # local image files may be read from these (and model_dirs)
    image_dirs: tuple[Path, ...] = setting(
        (),
        flag="--image-dir",
        many="repeat",
        parse=Path,
        group=MEDIA,
        help="a folder whose image files requests may name by path (repeatable; "
        "--model-dir folders are allowed too)",
    )
    max_image_bytes: int = setting(
        20 * 1024 * 1024,
        parse=positive_int,
        group=MEDIA,
        help="largest image a request may send or point to",
    )
    max_audio_bytes: int = setting(
        25 * 1024 * 1024,  # OpenAI's limit
        parse=positive_int,
        group=MEDIA,
        help="largest audio file a transcription may upload",
    )
    max_image_pixels: int = setting(
        2048 * 2048,
        parse=positive_int,
        group=MEDIA,
        help="larger images are downscaled to this many pixels (aspect kept)",
    )
    image_fetch_timeout: float = setting(
        10.0, group=MEDIA, help="seconds allowed for fetching an image URL"
    )
    allow_local_image_urls: bool = setting(
        False,
        group=MEDIA,
        help="image URLs may name loopback and private addresses (a local image server); "
        "link-local and metadata addresses are refused whatever this says",
    )
    responses_store_size: int = setting(
        1000,
        group=RESPONSES,
        help="most Responses API responses kept for previous_response_id (0: none)",
    )
    responses_store_mb: float = setting(
        256.0,
        parse=positive_float,
        group=RESPONSES,
        help="most megabytes (as JSON) the stored responses take; least recently used go first",
    )
    distributed: str | None = setting(
        None,
        choices="distributed modes",
        group=DISTRIBUTED,
        help="under mlx.launch, how the ranks split the model: tensor (every layer split) "
        "or pipeline (a run of layers each) (default: tensor where the architecture "
        "supports it)",
    )
    distributed_timeout: float = setting(
        30.0,
        parse=positive_float,
        group=DISTRIBUTED,
        help="seconds without a heartbeat after which a rank has failed: rank 0 answers "
        "503 and exits",
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
