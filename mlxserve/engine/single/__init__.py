"""One request at a time, for models whose caches do not batch (stream_session.py)."""
