"""OpenAI's audio endpoints: transcriptions, translations and speech."""
