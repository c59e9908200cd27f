"""Audio: speech to text (Whisper through mlx-audio) and text to speech (mlx-audio's
models), with the decoding and encoding of audio files in-process (PyAV)."""
