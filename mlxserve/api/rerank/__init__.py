"""Rerank in Cohere's and Jina's shape, and score in vLLM's."""
