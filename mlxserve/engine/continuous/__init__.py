"""The continuous batch (continuous_batch.py) and its row features (row_feature.py)."""
