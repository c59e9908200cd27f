"""Drafters: the models that guess tokens for the continuous batch to verify, beside the
one it serves (the batch's side of drafting, and the verify pass, are
`engine/speculation/`; a plain --draft-model is a language model mlx-lm loads as it is).

- A checkpoint's multi-token-prediction (MTP) head: Qwen3.5/3.6, Qwen3-Next, DeepSeek-V3
  and GLM-4.5+ are trained with one extra transformer layer that reads the model's last
  hidden state at position i and the token at i + 1, and predicts the token at i + 2.
  mlx-lm drops those weights when it loads the model; `mtp_load.py` reads them back from
  the checkpoint and `mtp_head.py` runs them.
- EAGLE-3 drafters (`eagle3.py`) and DFlash block drafters (`dflash.py`): --draft-model
  folders of those kinds, read with mlx-vlm's drafter loader.
- `hidden.py`: the model's hidden states taken from the batch's own forward pass, which
  all of them read.

The model loader (engine/memory/loader.py) reads them with the model they draft for.
"""
