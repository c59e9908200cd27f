"""Video clips in prompts: decoded and sampled into frames for a vision-language model."""
