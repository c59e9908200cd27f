"""Server-wide settings, filled from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class SamplingDefaults:
    """Used when a request leaves a sampling field out."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 512


@dataclass(frozen=True)
class ModelSettings:
    """A served model (a --model, or an entry of --config) and what it sets for itself;
    None: the server-wide setting."""

    model: str  # hub repo id or folder
    name: str | None = None  # the name clients use; None: `model`
    aliases: tuple[str, ...] = ()  # more names; one ending in "*" matches names it begins
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
    # --model and --config models, in order: all resident, the first the default
    models: tuple[ModelSettings, ...] = (ModelSettings("demo"),)
    # (client name, served model) pairs; a name ending in "*" matches any name it prefixes
    model_aliases: tuple[tuple[str, str], ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    max_context: int | None = None  # None: each model's own context length
    chat_template: str | None = None
    chat_template_args: dict = field(default_factory=dict)
    trust_remote_code: bool = False
    adapter_path: str | None = None
    draft_model: str | None = None
    num_draft_tokens: int = 3
    model_dirs: tuple[Path, ...] = ()
    # The Hugging Face cache and `mlxserve pull --quantize`'s folder: listed in /v1/models
    # and loadable on request (False: only the --model and --model-dir models are).
    cached_models: bool = True
    allowed_origins: tuple[str, ...] = ("*",)
    # Host header names answered; None: loopback names when bound to loopback, else any
    allowed_hosts: tuple[str, ...] | None = None
    read_timeout: float = 60.0  # a client silent this long while sending is let go
    max_body_bytes: int = 16 * 1024 * 1024
    api_key: str | None = None
    # signs thinking and seals reasoning and compactions; None: the install's key file
    secret_key: str | None = None
    log_level: str = "INFO"
    keepalive_seconds: float = 5.0
    reasoning_format: str = "separate"
    reasoning_parser: str | None = None  # None: detect from the tokenizer
    tool_parser: str | None = None  # None: detect from the tokenizer
    prompt_cache_size: int = 32
    prompt_cache_bytes: int | None = None  # None: no byte budget
    prompt_cache_dir: Path | None = None  # the disk tier; None: memory only
    prompt_cache_disk_gb: float = 10.0
    max_concurrent: int = 32
    max_queue: int = 256  # sequences waiting beyond the running ones; more get 503
    prefill_chunk: int = 256
    kv_bits: int | None = None  # KV caches quantized to 4 or 8 bits; None: not quantized
    kv_group_size: int = 64
    speculation: str = "auto"  # prompt-lookup drafts: "auto" (where they pay), "on", "off"
    max_draft: int = 8  # the most tokens drafted per sequence and step
    mtp: str = "auto"  # a checkpoint's MTP head drafts: "auto" (where they pay), "on", "off"
    text_only: bool = False  # vision-language checkpoints mlx-lm also loads are served as text
    cache_limit_gb: float | None = None  # MLX's buffer cache; None: a share of the budget
    memory_budget_gb: float | None = None  # weights + KV caches; None: the device's own
    image_dirs: tuple[Path, ...] = ()  # local image files may be read from these (and model_dirs)
    max_image_bytes: int = 20 * 1024 * 1024
    max_audio_bytes: int = 25 * 1024 * 1024  # an uploaded audio file (OpenAI's limit)
    max_image_pixels: int = 2048 * 2048  # larger images are downscaled, aspect kept
    image_fetch_timeout: float = 10.0
    allow_local_image_urls: bool = False  # image URLs may name loopback and private hosts
    responses_store_size: int = 1000  # stored Responses API responses; 0: none
    responses_store_mb: float = 256.0  # their bound in bytes, as JSON
    pin: bool = False  # the --model models are never unloaded
    idle_unload_seconds: float | None = None  # None: models stay until memory is needed
    # Under mlx.launch: "tensor" or "pipeline" parallelism; None: tensor where supported
    distributed: str | None = None
    distributed_timeout: float = 30.0  # a rank silent this long has failed

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
