"""Models on this machine: `mlxserve pull`, `ls` and `rm` (the Hugging Face cache, and the
folder of models `pull --quantize` converts)."""
