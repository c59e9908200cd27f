"""OpenAI's Images API: /v1/images/generations and /v1/images/edits."""
