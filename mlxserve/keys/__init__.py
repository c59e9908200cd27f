"""API keys a team shares a server with: each with its own models, rate limits and
daily quota, and its use counted per model and day. Kept in SQLite (`store`), enforced
by the server's gate (`gate`), managed with `mlxserve keys` (`commands`)."""
