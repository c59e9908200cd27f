"""What is in memory: resident models and adapters, loads in flight, KV bytes."""
