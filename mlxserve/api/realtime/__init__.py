"""OpenAI's Realtime API over a WebSocket: a live voice (or text) session on the served
models."""
