"""The server's OpenAPI 3.1 description (GET /openapi.json)."""
