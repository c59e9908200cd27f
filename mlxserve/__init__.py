"""mlxserve: an OpenAI-compatible HTTP server for MLX models."""

__version__ = "0.1.0"
