"""The one generation thread, in rooms (docs/ARCHITECTURE.md lists what each holds)."""
