"""Multi-token prediction (MTP) heads: the drafters some checkpoints ship beside the model.

Qwen3.5/3.6, Qwen3-Next, DeepSeek-V3 and GLM-4.5+ are trained with one extra transformer
layer that reads the model's last hidden state at position i and the token at i + 1, and
predicts the token at i + 2. mlx-lm drops those weights when it loads the model; this
package reads them back from the checkpoint (`load.py`), runs them (`head.py`) and takes
the model's hidden states from its forward pass (`hidden.py`), so that the continuous batch
can draft with them (`engine/head_drafts.py`).
"""
