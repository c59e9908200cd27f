"""Rerankers: a relevance score for each (query, document) pair."""
