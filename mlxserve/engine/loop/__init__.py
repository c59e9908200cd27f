"""The generation loop, the thread it runs on, and the requests it takes (worker.py)."""
