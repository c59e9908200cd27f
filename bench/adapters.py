"""Several LoRA adapters on one base: aggregate decode speed of concurrent requests spread
over four adapters, against the same requests on the base alone, in one run; and
mlx_lm.server serving the same mix through its per-request `adapters` field.

The adapters are random (rank 16 on every linear layer of every block, as `mlx_lm.lora
--num-layers -1` trains them), written in mlx-lm's layout next to the bench model: speed
does not depend on what they learned.

    make bench-adapters                          # 50m model, 3 rounds, 8 streams
    make bench-adapters ARGS="--model 7m --rounds 1"
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import models
from harness import Reply, Target, print_medians

from bench import Workload

ADAPTERS = 4
RANK = 16
TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def random_adapters(base: Path) -> list[Path]:
    """ADAPTERS random adapters for `base` (made once, beside it)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load

    folders = [base.with_name(f"{base.name}-lora{i}") for i in range(ADAPTERS)]
    if all((f / "adapters.safetensors").exists() for f in folders):
        return folders
    model, _ = load(str(base))
    shapes = {
        name.removesuffix(".weight"): value.shape
        for name, value in tree_flatten(model.parameters())
        if name.endswith(".weight") and any(f".{t}." in name for t in TARGETS)
    }
    config = json.loads((base / "config.json").read_text())
    for i, folder in enumerate(folders):
        mx.random.seed(i)
        weights = {}
        for module, (out_dims, in_dims) in shapes.items():
            weights[f"{module}.lora_a"] = mx.random.uniform(-0.05, 0.05, (in_dims, RANK))
            weights[f"{module}.lora_b"] = mx.random.normal((RANK, out_dims)) * 0.01
        folder.mkdir(exist_ok=True)
        mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
        (folder / "adapter_config.json").write_text(
            json.dumps(
                {
                    "fine_tune_type": "lora",
                    "num_layers": config["num_hidden_layers"],
                    "lora_parameters": {"rank": RANK, "scale": 20.0, "dropout": 0.0},
                }
            )
        )
    return folders


def run(target: Target, w: Workload, asked: list[str | None], fields: list[dict] | None = None):
    """One streamed request per entry, all at once: aggregate tok/s and the slowest
    first token."""
    start = time.perf_counter()
    requests = [(w.user(20), w.tokens) for _ in asked]
    replies: list[Reply] = target.chat_together(requests, w.logit_bias, asked, fields=fields)
    wall = max(r.finished for r in replies) - start
    return {
        "tok/s": sum(r.completion_tokens for r in replies) / wall,
        "slowest TTFT s": max(r.stamps[0] - start for r in replies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="50m", help=f"of {', '.join(models.MODELS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128, help="decoded per reply")
    args = parser.parse_args()

    import mlx.core as mx

    path = models.build(models.MODELS[args.model])
    folders = random_adapters(path)
    w = Workload(path, args.tokens, 2000)
    names = [f"lora{i}" for i in range(ADAPTERS)]
    mixed = [names[i % ADAPTERS] for i in range(args.streams)]
    base: list[str | None] = [None] * args.streams
    lora = [
        f
        for name, folder in zip(names, folders, strict=True)
        for f in ("--lora", f"{name}={folder}")
    ]
    print(
        f"device {mx.default_device()}, {path.name}, {args.streams} streams, "
        f"{ADAPTERS} adapters of rank {RANK}"
    )
    rows: dict[str, list[dict]] = {
        "mlxserve, base only": [],
        f"mlxserve, {ADAPTERS} adapters mixed": [],
        "mlx_lm.server, base only": [],
        f"mlx_lm.server, {ADAPTERS} adapters mixed": [],
    }
    per_request = [{"adapters": str(folders[i % ADAPTERS])} for i in range(args.streams)]
    for _ in range(args.rounds):
        target = Target("mlxserve", path, *lora)
        try:
            run(target, w, mixed)  # warm-up: every adapter read
            rows["mlxserve, base only"].append(run(target, w, base))
            rows[f"mlxserve, {ADAPTERS} adapters mixed"].append(run(target, w, mixed))
        finally:
            target.stop()
        target = Target("mlx_lm.server", path)
        try:
            run(target, w, [None])  # warm-up
            rows["mlx_lm.server, base only"].append(run(target, w, base))
            rows[f"mlx_lm.server, {ADAPTERS} adapters mixed"].append(
                run(target, w, base, per_request)
            )
        finally:
            target.stop()
    print_medians(rows, "slowest TTFT s")


if __name__ == "__main__":
    main()
