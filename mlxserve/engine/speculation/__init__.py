"""Drafts verified in the continuous batch's decode step, and rolled back (verify.py)."""
