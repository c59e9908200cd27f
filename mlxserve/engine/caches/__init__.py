"""The prompt cache: prefixes in memory, their disk tier, quantized KV caches."""
