"""Images out: text-to-image models and the renders that share the generation thread."""
