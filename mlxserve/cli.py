"""Command line -> ServerConfig, logging, and the server."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from jinja2 import TemplateError, TemplateSyntaxError

from mlxserve import __version__
from mlxserve.compat import compile_chat_template
from mlxserve.config import ModelSettings, SamplingDefaults, ServerConfig
from mlxserve.config_file import load_models
from mlxserve.distributed.world import MODES
from mlxserve.postprocess import reasoning, tools
from mlxserve.telemetry.record import RequestIdFilter

DEFAULTS = ServerConfig()  # every flag's default is the config's own
SAMPLING = DEFAULTS.defaults


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def model_alias(text: str) -> tuple[str, str]:
    name, sep, model = text.partition("=")
    if not sep or not name.strip() or not model.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=MODEL, not {text!r}")
    return name.strip(), model.strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlxserve", description="An OpenAI-compatible HTTP server for MLX models."
    )
    p.add_argument(
        "--model",
        action="append",
        help="hub repo id or local folder; 'demo' (default) serves SmolLM2-135M-Instruct. "
        "Repeatable: every one is loaded at start and kept resident; the first is the default",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="a TOML file of models to serve (after the --model ones) with their own "
        "names, aliases, chat template, parsers, draft model, context limit and pinning",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="never unload the --model models (for memory or when idle)",
    )
    p.add_argument(
        "--idle-unload-seconds",
        type=positive_float,
        help="unload a model idle this long (default: models stay until memory is needed)",
    )
    p.add_argument(
        "--model-alias",
        action="append",
        default=[],
        type=model_alias,
        metavar="NAME=MODEL",
        help="answer requests for NAME with MODEL (repeatable); a NAME ending in '*' matches "
        "every name it begins, e.g. 'claude-*=demo' for Claude Code",
    )
    p.add_argument("--host", default=DEFAULTS.host)
    p.add_argument("--port", type=int, default=DEFAULTS.port, help="0 picks a free port")
    p.add_argument("--temp", type=float, default=SAMPLING.temperature, help="default temperature")
    p.add_argument("--top-p", type=float, default=SAMPLING.top_p)
    p.add_argument("--top-k", type=int, default=SAMPLING.top_k)
    p.add_argument("--min-p", type=float, default=SAMPLING.min_p)
    p.add_argument(
        "--max-tokens", type=int, default=SAMPLING.max_tokens, help="default max_tokens per request"
    )
    p.add_argument(
        "--max-context",
        type=positive_int,
        help="most tokens a request may take, prompt and output together (default: the "
        "context length in the model's config; this may only lower it)",
    )
    p.add_argument("--chat-template", help="a Jinja chat template, or a file holding one")
    p.add_argument(
        "--chat-template-args",
        type=json.loads,
        default=DEFAULTS.chat_template_args,
        help="JSON object passed to the chat template",
    )
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--adapter-path", help="LoRA adapters to apply to the served model")
    p.add_argument(
        "--draft-model",
        help="a draft model for speculative decoding, or an EAGLE-3 drafter (mlx-vlm's format)",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=DEFAULTS.num_draft_tokens,
        help="tokens drafted per sequence and step by a draft model, an EAGLE-3 drafter or "
        "an MTP head",
    )
    p.add_argument(
        "--model-dir",
        action="append",
        default=[],
        type=Path,
        help="a folder whose models clients may load (repeatable)",
    )
    p.add_argument(
        "--no-cached-models",
        dest="cached_models",
        action="store_false",
        help="neither list nor load the models in the Hugging Face cache and those "
        "`mlxserve pull --quantize` made; only --model and --model-dir ones",
    )
    p.add_argument(
        "--allowed-origins",
        default=",".join(DEFAULTS.allowed_origins),
        help="comma-separated CORS origins",
    )
    p.add_argument(
        "--allowed-hosts",
        help="comma-separated Host header names to answer, or '*' (default: loopback names "
        "and host.docker.internal when bound to loopback, any name otherwise)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULTS.read_timeout,
        help="seconds a client may stay silent while sending a request (or idle between "
        "requests on a kept-alive connection) before it is let go",
    )
    p.add_argument("--max-body-bytes", type=int, default=DEFAULTS.max_body_bytes)
    p.add_argument(
        "--api-key",
        default=os.environ.get("MLXSERVE_API_KEY"),
        help="require this key (also MLXSERVE_API_KEY)",
    )
    p.add_argument(
        "--secret-key",
        default=os.environ.get("MLXSERVE_SECRET_KEY"),
        help="sign thinking blocks and seal reasoning and compactions with this key (also "
        "MLXSERVE_SECRET_KEY; the same on servers behind one name); default: a random key "
        "made once per install in the cache folder",
    )
    p.add_argument(
        "--keepalive-seconds",
        type=float,
        default=DEFAULTS.keepalive_seconds,
        help="send an SSE comment when a stream has been silent this long",
    )
    p.add_argument(
        "--reasoning-format",
        default=DEFAULTS.reasoning_format,
        choices=reasoning.FORMATS,
        help="reasoning as reasoning_content fields (separate), inline <think> tags, "
        "a <details> block, or hidden",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=[*sorted(reasoning.TAGS_BY_NAME), "harmony"],
        help="override the reasoning tags detected from the tokenizer",
    )
    p.add_argument(
        "--tool-parser",
        choices=[*tools.names(), "harmony"],
        help="override the tool-call format detected from the chat template",
    )
    p.add_argument(
        "--prompt-cache-size",
        type=int,
        default=DEFAULTS.prompt_cache_size,
        help="prompt prefixes kept in memory",
    )
    p.add_argument(
        "--prompt-cache-bytes",
        type=int,
        help="byte budget of the prompt prefixes in memory, running requests' caches "
        "included (least recently used go first)",
    )
    p.add_argument(
        "--prompt-cache-dir",
        type=Path,
        help="keep evicted prompt prefixes (and all of them at shutdown) in this folder, "
        "reused after a restart",
    )
    p.add_argument(
        "--prompt-cache-disk-gb",
        type=float,
        default=DEFAULTS.prompt_cache_disk_gb,
        help="size cap of --prompt-cache-dir (oldest used go first)",
    )
    p.add_argument(
        "--max-concurrent",
        type=positive_int,
        default=DEFAULTS.max_concurrent,
        help="most sequences decoding together",
    )
    p.add_argument(
        "--max-queue",
        type=positive_int,
        default=DEFAULTS.max_queue,
        help="most sequences waiting for a slot; beyond it requests get 503 with Retry-After",
    )
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULTS.prefill_chunk,
        help="prompt tokens processed per decode step of the running streams",
    )
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=[4, 8],
        help="quantize the KV caches (running requests, prompt cache, disk tier) to this "
        "many bits: about 3.6x (4) or 2x (8) less memory per token",
    )
    p.add_argument(
        "--kv-group-size",
        type=int,
        choices=[32, 64, 128],
        default=DEFAULTS.kv_group_size,
        help="values sharing one scale in the quantized KV cache",
    )
    p.add_argument(
        "--speculation",
        choices=["auto", "on", "off"],
        default=DEFAULTS.speculation,
        help="draft tokens from the context (prompt lookup) and verify them in the decode "
        "step; auto: only where this device verifies a draft for less than it saves",
    )
    p.add_argument(
        "--max-draft",
        type=int,
        default=DEFAULTS.max_draft,
        help="the most tokens drafted per sequence and step (0: no speculation)",
    )
    p.add_argument(
        "--mtp",
        choices=["auto", "on", "off"],
        default=DEFAULTS.mtp,
        help="draft with the MTP head a checkpoint carries (Qwen's mtp.*, GLM-4.5+ and "
        "DeepSeek-V3's layer after the last), --num-draft-tokens per step; auto: only where "
        "this device verifies the drafts for less than they can save; off: not loaded",
    )
    p.add_argument(
        "--text-only",
        action="store_true",
        help="serve vision-language checkpoints that mlx-lm also loads (Qwen3.5/3.6) as text "
        "models: batched, drafting with their MTP head, without image input",
    )
    p.add_argument(
        "--memory-budget-gb",
        type=positive_float,
        help="memory for the weights and every KV cache (running requests, then the "
        "prompt cache); a request that does not fit waits, one that never can is a 400 "
        "(default: the device's recommended working set)",
    )
    p.add_argument(
        "--cache-limit-gb",
        type=float,
        help="limit of MLX's buffer cache (memory kept for reuse after arrays are freed; "
        "default: a tenth of the memory budget, or MLX's own limit if lower)",
    )
    p.add_argument(
        "--image-dir",
        action="append",
        default=[],
        type=Path,
        help="a folder whose image files requests may name by path (repeatable; "
        "--model-dir folders are allowed too)",
    )
    p.add_argument(
        "--max-image-bytes",
        type=positive_int,
        default=DEFAULTS.max_image_bytes,
        help="largest image a request may send or point to",
    )
    p.add_argument(
        "--max-audio-bytes",
        type=positive_int,
        default=DEFAULTS.max_audio_bytes,
        help="largest audio file a transcription may upload",
    )
    p.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=DEFAULTS.max_image_pixels,
        help="larger images are downscaled to this many pixels (aspect kept)",
    )
    p.add_argument(
        "--image-fetch-timeout",
        type=float,
        default=DEFAULTS.image_fetch_timeout,
        help="seconds allowed for fetching an image URL",
    )
    p.add_argument(
        "--allow-local-image-urls",
        action="store_true",
        help="image URLs may name loopback and private addresses (a local image server); "
        "link-local and metadata addresses are refused whatever this says",
    )
    p.add_argument(
        "--responses-store-size",
        type=int,
        default=DEFAULTS.responses_store_size,
        help="most Responses API responses kept for previous_response_id (0: none)",
    )
    p.add_argument(
        "--responses-store-mb",
        type=positive_float,
        default=DEFAULTS.responses_store_mb,
        help="most megabytes (as JSON) the stored responses take; least recently used go first",
    )
    p.add_argument(
        "--distributed",
        choices=MODES,
        help="under mlx.launch, how the ranks split the model: tensor (every layer split) "
        "or pipeline (a run of layers each) (default: tensor where the architecture "
        "supports it)",
    )
    p.add_argument(
        "--distributed-timeout",
        type=positive_float,
        default=DEFAULTS.distributed_timeout,
        help="seconds without a heartbeat after which a rank has failed: rank 0 answers "
        "503 and exits",
    )
    p.add_argument(
        "--log-level", default=DEFAULTS.log_level, choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    p.add_argument("--version", action="version", version=f"mlxserve {__version__}")
    return p


def chat_template(value: str | None) -> str | None:
    """--chat-template: Jinja text (it has {{ or {%), else the path of a file holding it; a
    path that names no file is an error, not a template that prints the path, and so is a
    template that does not compile."""
    if value is None:
        return None
    text = value
    if "{{" not in value and "{%" not in value:
        path = Path(value).expanduser()
        try:
            found = path.is_file()
        except (OSError, ValueError):  # a name too long, a NUL byte
            found = False
        if not found:
            raise SystemExit(
                f"mlxserve: --chat-template {value!r} is neither a file nor a template"
            )
        text = path.read_text()
    try:
        compile_chat_template(text)
    except TemplateError as e:
        line = f" (line {e.lineno})" if isinstance(e, TemplateSyntaxError) else ""
        raise SystemExit(f"mlxserve: the chat template does not compile{line}: {e}") from e
    return text


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def served_models(args: argparse.Namespace) -> tuple[ModelSettings, ...]:
    """--model models first, then --config ones; the demo model when neither names one."""
    from_file = load_models(args.config, chat_template) if args.config else ()
    named = tuple(ModelSettings(model) for model in args.model or [])
    return named + from_file or (ModelSettings("demo"),)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    if not isinstance(args.chat_template_args, dict):
        raise SystemExit("mlxserve: --chat-template-args must be a JSON object")
    return ServerConfig(
        models=served_models(args),
        model_aliases=tuple(args.model_alias),
        host=args.host,
        port=args.port,
        defaults=SamplingDefaults(args.temp, args.top_p, args.top_k, args.min_p, args.max_tokens),
        max_context=args.max_context,
        chat_template=chat_template(args.chat_template),
        chat_template_args=args.chat_template_args,
        trust_remote_code=args.trust_remote_code,
        adapter_path=args.adapter_path,
        draft_model=args.draft_model,
        num_draft_tokens=args.num_draft_tokens,
        model_dirs=tuple(args.model_dir),
        cached_models=args.cached_models,
        allowed_origins=_names(args.allowed_origins),
        allowed_hosts=_names(args.allowed_hosts) if args.allowed_hosts else None,
        read_timeout=args.read_timeout,
        max_body_bytes=args.max_body_bytes,
        api_key=args.api_key or None,
        secret_key=args.secret_key or None,
        log_level=args.log_level,
        keepalive_seconds=args.keepalive_seconds,
        reasoning_format=args.reasoning_format,
        reasoning_parser=args.reasoning_parser,
        tool_parser=args.tool_parser,
        prompt_cache_size=args.prompt_cache_size,
        prompt_cache_bytes=args.prompt_cache_bytes,
        prompt_cache_dir=args.prompt_cache_dir,
        prompt_cache_disk_gb=args.prompt_cache_disk_gb,
        max_concurrent=args.max_concurrent,
        max_queue=args.max_queue,
        prefill_chunk=args.prefill_chunk,
        kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size,
        speculation=args.speculation,
        max_draft=args.max_draft,
        mtp=args.mtp,
        text_only=args.text_only,
        cache_limit_gb=args.cache_limit_gb,
        memory_budget_gb=args.memory_budget_gb,
        image_dirs=tuple(args.image_dir),
        max_image_bytes=args.max_image_bytes,
        max_audio_bytes=args.max_audio_bytes,
        max_image_pixels=args.max_image_pixels,
        image_fetch_timeout=args.image_fetch_timeout,
        allow_local_image_urls=args.allow_local_image_urls,
        responses_store_size=args.responses_store_size,
        responses_store_mb=args.responses_store_mb,
        pin=args.pin,
        idle_unload_seconds=args.idle_unload_seconds,
        distributed=args.distributed,
        distributed_timeout=args.distributed_timeout,
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["launch"]:  # mlxserve launch claude|codex: see agents/launch.py
        from mlxserve.agents.launch import main as launch

        sys.exit(launch(argv[1:]))
    if argv[:1] in (["pull"], ["ls"], ["rm"]):  # models on this machine: see hub/commands.py
        from mlxserve.hub.commands import main as models

        sys.exit(models(argv))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    config = config_from_args(parser().parse_args(argv))
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())  # lines written while answering carry its id
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(request)s%(message)s",
        handlers=[handler],
    )
    from mlxserve.server import run

    run(config)
