"""JSON Schemas of what the server answers: each reply object, as the dialect that owns it
words it, and each dialect's error body. They name the fields a client reads and their
types; every object may carry more (what the references add over time)."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}
# One server-sent event of a streamed reply (its data: JSON, or [DONE] for OpenAI's).
SSE_EVENT: Schema = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
NULL_STRING: Schema = {"type": ["string", "null"]}
NULL_INTEGER: Schema = {"type": ["integer", "null"]}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """An object with these fields (`required` always present)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **(optional or {})},
    }


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


JSON, SSE, TEXT = "application/json", "text/event-stream", "text/plain"
NDJSON = "application/x-ndjson"


def stream(whole: Schema) -> dict[str, Schema]:
    """A reply whole, or as server-sent events when the request asks to stream."""
    return {JSON: whole, SSE: SSE_EVENT}


def either(*shapes: Schema) -> Schema:
    """A reply in one of several shapes (by the dialect the request asks for)."""
    return {"anyOf": list(shapes)}


def lines(whole: Schema) -> dict[str, Schema]:
    """Ollama's: NDJSON lines unless the request says `stream: false` (then whole)."""
    return {JSON: whole, NDJSON: STRING}


def binary(content_type: str) -> Schema:
    return {"type": "string", "contentMediaType": content_type}


# Errors ----------------------------------------------------------------------------------

OPENAI_ERROR = obj(
    {
        "error": obj(
            {
                "message": STRING,
                "type": STRING,
                "param": NULL_STRING,
                "code": {"type": ["string", "integer", "null"]},
            }
        )
    }
)
ANTHROPIC_ERROR = obj(
    {"type": {"const": "error"}, "error": obj({"type": STRING, "message": STRING})}
)
LLAMA_CPP_ERROR = obj({"error": obj({"code": INTEGER, "message": STRING, "type": STRING})})

# OpenAI --------------------------------------------------------------------------------

USAGE = obj(
    {"prompt_tokens": INTEGER, "completion_tokens": INTEGER, "total_tokens": INTEGER},
    {"prompt_tokens_details": OBJECT, "completion_tokens_details": OBJECT},
)
CHAT_COMPLETION = obj(
    {
        "id": STRING,
        "object": {"const": "chat.completion"},
        "created": INTEGER,
        "model": STRING,
        "choices": array(
            obj(
                {
                    "index": INTEGER,
                    "message": obj({"role": {"const": "assistant"}}, {"content": NULL_STRING}),
                    "finish_reason": NULL_STRING,
                }
            )
        ),
        "usage": USAGE,
    }
)
TEXT_COMPLETION = obj(
    {
        "id": STRING,
        "object": {"const": "text_completion"},
        "created": INTEGER,
        "model": STRING,
        "choices": array(obj({"index": INTEGER, "text": STRING, "finish_reason": NULL_STRING})),
        "usage": USAGE,
    }
)
MODEL = obj(
    {"id": STRING, "object": {"const": "model"}, "owned_by": STRING},
    {
        "kind": STRING,
        "context_length": NULL_INTEGER,
        "state": STRING,
        "pinned": BOOLEAN,
        "size_bytes": INTEGER,
        "base": STRING,
    },
)
MODEL_LIST = obj({"object": {"const": "list"}, "data": array(ref("Model"))})
# Anthropic's ModelInfo and its page: the model list for a request with anthropic-version.
ANTHROPIC_MODEL = obj(
    {
        "type": {"const": "model"},
        "id": STRING,
        "display_name": STRING,
        "created_at": {"type": "string", "format": "date-time"},
    },
    {
        "max_input_tokens": NULL_INTEGER,
        "max_tokens": NULL_INTEGER,
        "lifecycle": {"enum": ["active", "deprecated", "retired"]},
    },
)
ANTHROPIC_MODEL_LIST = obj(
    {
        "data": array(ref("AnthropicModel")),
        "has_more": BOOLEAN,
        "first_id": NULL_STRING,
        "last_id": NULL_STRING,
    }
)
MODEL_STATE = obj({"id": STRING, "object": {"const": "model"}, "state": STRING, "pinned": BOOLEAN})
DELETED_MODEL = obj({"id": STRING, "object": {"const": "model"}, "deleted": BOOLEAN})
EMBEDDINGS = obj(
    {
        "object": {"const": "list"},
        "data": array(
            obj(
                {
                    "object": {"const": "embedding"},
                    "index": INTEGER,
                    "embedding": {"type": ["array", "string"]},  # floats, or base64
                }
            )
        ),
        "model": STRING,
        "usage": obj({"prompt_tokens": INTEGER, "total_tokens": INTEGER}),
    }
)
TOKENIZED = obj(
    {"count": INTEGER, "max_model_len": NULL_INTEGER, "tokens": array(INTEGER)},
    {"token_strs": array(STRING)},
)
DETOKENIZED = obj({"prompt": STRING})
TRANSCRIPTION = obj(
    {"text": STRING}, {"language": STRING, "duration": NUMBER, "segments": array(OBJECT)}
)
RERANKED = obj({"results": array(obj({"index": INTEGER, "relevance_score": NUMBER}))})
SCORED = obj({"object": {"const": "list"}, "data": array(obj({"index": INTEGER, "score": NUMBER}))})
INFILLED = obj({"content": STRING})
_IMAGE_TOKENS = obj({"image_tokens": INTEGER, "text_tokens": INTEGER})
IMAGES = obj(
    {
        "created": INTEGER,
        "data": array(obj({}, {"b64_json": STRING, "url": STRING})),
        "background": STRING,
        "output_format": {"enum": ["png", "jpeg", "webp"]},
        "quality": STRING,
        "size": STRING,
        "usage": obj(
            {
                "input_tokens": INTEGER,
                "input_tokens_details": _IMAGE_TOKENS,
                "output_tokens": INTEGER,
                "output_tokens_details": _IMAGE_TOKENS,
                "total_tokens": INTEGER,
            }
        ),
    }
)

# Anthropic -------------------------------------------------------------------------------

MESSAGE = obj(
    {
        "id": STRING,
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "content": array(obj({"type": STRING})),
        "model": STRING,
        "stop_reason": NULL_STRING,
        "usage": obj({"input_tokens": INTEGER, "output_tokens": INTEGER}),
    }
)
TOKEN_COUNT = obj({"input_tokens": INTEGER})

# Responses -------------------------------------------------------------------------------

RESPONSE = obj(
    {
        "id": STRING,
        "object": {"const": "response"},
        "created_at": NUMBER,
        "status": STRING,
        "model": STRING,
        "output": array(obj({"type": STRING})),
    },
    {"usage": {"type": ["object", "null"]}},
)
COMPACTION = obj({"id": STRING, "object": STRING, "output": array(obj({"type": STRING}))})
DELETED_RESPONSE = obj({"id": STRING, "object": {"const": "response.deleted"}, "deleted": BOOLEAN})
ITEM = obj({"type": STRING, "id": STRING})
ITEM_LIST = obj({"object": {"const": "list"}, "data": array(ITEM), "has_more": BOOLEAN})
CONVERSATION = obj(
    {
        "id": STRING,
        "object": {"const": "conversation"},
        "created_at": INTEGER,
        "metadata": OBJECT,
    }
)
DELETED_CONVERSATION = obj(
    {"id": STRING, "object": {"const": "conversation.deleted"}, "deleted": BOOLEAN}
)

# Batch jobs ------------------------------------------------------------------------------

FILE = obj(
    {
        "id": STRING,
        "object": {"const": "file"},
        "bytes": INTEGER,
        "created_at": INTEGER,
        "filename": STRING,
        "purpose": STRING,
    }
)
FILE_LIST = obj({"object": {"const": "list"}, "data": array(ref("File")), "has_more": BOOLEAN})
DELETED_FILE = obj({"id": STRING, "object": {"const": "file"}, "deleted": BOOLEAN})
BATCH = obj(
    {
        "id": STRING,
        "object": {"const": "batch"},
        "endpoint": STRING,
        "status": STRING,
        "created_at": INTEGER,
        "request_counts": obj({"total": INTEGER, "completed": INTEGER, "failed": INTEGER}),
    }
)
BATCH_LIST = obj({"object": {"const": "list"}, "data": array(ref("Batch")), "has_more": BOOLEAN})
MESSAGE_BATCH = obj(
    {
        "id": STRING,
        "type": {"const": "message_batch"},
        "processing_status": STRING,
        "request_counts": OBJECT,
        "created_at": STRING,
    }
)
MESSAGE_BATCH_LIST = obj({"data": array(ref("MessageBatch")), "has_more": BOOLEAN})
DELETED_MESSAGE_BATCH = obj({"id": STRING, "type": {"const": "message_batch_deleted"}})

# The server ------------------------------------------------------------------------------

HEALTH = obj({"status": STRING}, {"model": STRING, "prompt_cache_disk": OBJECT})
MCP_SERVER = obj(
    {
        "name": STRING,
        "transport": {"enum": ["stdio", "http"]},
        "target": {"type": ["string", "null"]},  # null to a key that is not an admin's
        "state": {"enum": ["starting", "ready", "restarting"]},
        "tools": array(STRING),
        "error": {"type": ["string", "null"]},
        "restarts": INTEGER,
    }
)
STATUS = obj(
    {
        "object": {"const": "status"},
        "warnings": array(STRING),
        "requests": obj({"running": INTEGER, "waiting": INTEGER}),
        "websockets": INTEGER,
        "mcp_servers": array(MCP_SERVER),
        "models": array(OBJECT),
        "recent": array(OBJECT),
        "batches": OBJECT,
        "usage": array(OBJECT),
    }
)
METERED = obj(
    {
        "requests": INTEGER,
        "prompt_tokens": INTEGER,
        "cached_tokens": INTEGER,
        "completion_tokens": INTEGER,
        "audio_seconds": NUMBER,
        "images": INTEGER,
        "embedding_inputs": INTEGER,
        "mcp_calls": INTEGER,
        "mcp_seconds": NUMBER,
    }
)
USAGE_LIST = obj(
    {
        "object": {"const": "list"},
        "data": array(
            {"allOf": [ref("Metered"), obj({"key": STRING, "model": STRING, "date": STRING})]}
        ),
        "total": ref("Metered"),
    }
)
MCP_SERVER_LIST = obj({"object": {"const": "list"}, "data": array(MCP_SERVER)})
KEY_LIST = obj(
    {
        "object": {"const": "list"},
        "data": array(
            obj(
                {
                    "object": {"const": "api_key"},
                    "name": STRING,
                    "hint": STRING,
                    "admin": BOOLEAN,
                    "models": {"type": ["array", "null"], "items": STRING},
                }
            )
        ),
    }
)
OPENAPI = obj({"openapi": STRING, "info": OBJECT, "paths": OBJECT})

# Ollama --------------------------------------------------------------------------------

OLLAMA_ERROR = obj({"error": STRING})
OLLAMA_DETAILS = obj(
    {
        "format": STRING,
        "family": STRING,
        "families": array(STRING),
        "parameter_size": STRING,
        "quantization_level": STRING,
    },
    {"parent_model": STRING},
)
_OLLAMA_MODEL = {
    "name": STRING,
    "model": STRING,
    "size": INTEGER,
    "digest": STRING,
    "details": OLLAMA_DETAILS,
}
OLLAMA_TAGS = obj({"models": array(obj({**_OLLAMA_MODEL, "modified_at": STRING}))})
OLLAMA_PS = obj(
    {
        "models": array(
            obj(
                {
                    **_OLLAMA_MODEL,
                    "expires_at": STRING,
                    "size_vram": INTEGER,
                    "context_length": INTEGER,
                }
            )
        )
    }
)
OLLAMA_VERSION = obj({"version": STRING})
OLLAMA_SHOW = obj(
    {
        "details": OLLAMA_DETAILS,
        "model_info": OBJECT,
        "capabilities": array(STRING),
        "modified_at": STRING,
    },
    {"template": STRING, "parameters": STRING, "modelfile": STRING, "license": STRING},
)
# A chat or generate reply whole, or its last NDJSON line (the others have done: false)
OLLAMA_REPLY = obj(
    {"model": STRING, "created_at": STRING, "done": BOOLEAN},
    {
        "message": obj({"role": STRING, "content": STRING}),
        "response": STRING,
        "thinking": STRING,
        "done_reason": STRING,
        "total_duration": INTEGER,
        "load_duration": INTEGER,
        "prompt_eval_count": INTEGER,
        "prompt_eval_duration": INTEGER,
        "eval_count": INTEGER,
        "eval_duration": INTEGER,
        "context": array(INTEGER),
    },
)
OLLAMA_EMBED = obj({"model": STRING, "embeddings": array(array(NUMBER))})
OLLAMA_EMBEDDING = obj({"embedding": array(NUMBER)})
OLLAMA_PROGRESS = obj(
    {"status": STRING}, {"digest": STRING, "total": INTEGER, "completed": INTEGER}
)

# Named in components (referenced where they recur).
COMPONENTS: dict[str, Schema] = {
    "OpenAIError": OPENAI_ERROR,
    "AnthropicError": ANTHROPIC_ERROR,
    "LlamaCppError": LLAMA_CPP_ERROR,
    "OllamaError": OLLAMA_ERROR,
    "Model": MODEL,
    "Conversation": CONVERSATION,
    "AnthropicModel": ANTHROPIC_MODEL,
    "File": FILE,
    "Batch": BATCH,
    "MessageBatch": MESSAGE_BATCH,
    "Metered": METERED,
}
