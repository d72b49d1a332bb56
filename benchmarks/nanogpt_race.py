"""bytelm's CPU recipes against nanoGPT at equal training time, on the identical held-out bytes.

"How good a byte-level model do I get in ten minutes on a laptop?" with nanoGPT's character-level
recipe as the thing to beat. Nothing of nanoGPT is in this repository: clone it yourself
(``git clone https://github.com/karpathy/nanoGPT DIR``) and pass ``--nanogpt DIR``; its
``model.py`` (``GPT``, ``GPTConfig``, ``configure_optimizers``) is imported from there.

1. The corpus ``--data`` is prepared with the recipes' data settings (``configs/cpu/base.toml``:
   256-byte held-out segments); ``bytelm data export-heldout`` writes the scored segments.
2. nanoGPT trains in a subprocess on exactly bytelm's training stream (the train documents as
   ``[BOS, byte+4, ..., EOS]``, vocabulary 260), with the loop of its ``train.py``: random
   windows of ``block_size + 1``, AdamW from ``configure_optimizers`` (decay on 2-D weights),
   linear warmup then cosine to ``lr / 10``, clipping at 1.0, fp32, no ``torch.compile``, no
   dropout (its CPU settings). Its shape is 6 layers x 192 wide x 6 heads, context 256, batch
   16; ``max_iters`` fills ``--seconds`` at the measured pace, planned by bytelm's own rule for
   its time budgets (after 4 steps, again at 8, 16, 32, ... steps inside the warmup and the first
   fifth of the decay), and the run's own training time is reported. Warmup: 100 steps (its
   shakespeare recipe), at most a fifth of the run. It then scores every held-out segment from BOS and writes
   a ``bytelm-scores`` file.
3. Each bytelm family trains with its recipe, ``bytelm train cpu/FAMILY --minutes`` (or the preset
   given by ``--recipe FAMILY=PRESET``, e.g. a ten-minute recipe), for the same training time
   (BLT's entropy model and the subword tokenizer first, outside the budget).
4. ``bytelm eval`` scores them all, nanoGPT through ``--external``, on one fingerprint.

Prints the report and, last, one JSON line: each model's BPB and training seconds, the best
bytelm family and its BPB as a ratio of nanoGPT's. Nothing else should run on the machine.

    python benchmarks/nanogpt_race.py --nanogpt DIR --data files:PATH?split=paragraph --seconds 600
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from results import record

FAMILIES = ("byte", "megabyte", "blt", "bpe")
BOS_ID = 1  # bytelm.constants.BOS_ID; the worker below imports no bytelm (it runs torch only)


def bytelm(*args: str) -> None:
    cmd = [sys.executable, "-m", "bytelm", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def finished(run_dir: Path) -> bool:
    info = run_dir / "run.json"
    return info.is_file() and json.loads(info.read_text()).get("status") == "finished"


# -- the nanoGPT side (a subprocess: torch alone, no JAX beside it) ------------------------------
def nanogpt_lr(it: int, lr: float, warmup: int, max_iters: int) -> float:
    """nanoGPT's schedule: linear warmup, then cosine to lr / 10 at lr_decay_iters = max_iters."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    ratio = min(1.0, (it - warmup) / max(1, max_iters - warmup))
    return lr / 10 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - lr / 10)


def nanogpt_worker(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(Path(args.nanogpt).resolve()))
    from model import GPT, GPTConfig  # nanoGPT's own model.py

    out = Path(args.out)
    data = np.load(out / "train_ids.npy").astype(np.int64)
    block, batch = 256, 16
    conf = dict(n_layer=6, n_head=6, n_embd=192, block_size=block, bias=False, vocab_size=260, dropout=0.0)
    gen = torch.Generator().manual_seed(1337)

    def get_batch():
        ix = torch.randint(len(data) - block, (batch,), generator=gen)
        x = torch.stack([torch.from_numpy(data[i : i + block]) for i in ix.tolist()])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block]) for i in ix.tolist()])
        return x, y

    torch.manual_seed(1337)
    model = GPT(GPTConfig(**conf))
    opt = model.configure_optimizers(0.1, args.lr, (0.9, 0.99), "cpu")

    def step(lr):
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    # max_iters (= lr_decay_iters) fills the budget at the measured pace, planned as bytelm plans its
    # own horizon: after 4 steps, then again at 8, 16, 32, ... steps while inside the warmup or the
    # first fifth of the decay, where the learning rate barely depends on it (the first steps of a
    # process run slower than the rest)
    model.train()
    t0 = time.perf_counter()
    max_iters = warmup = None
    mark = (0.0, 0)
    it = 0
    replanning = True
    while max_iters is None or it < max_iters:
        if max_iters is None:
            lr = args.lr * (it + 1) / 101  # the first 4 steps, before the plan: a warmup of 100 assumed
        else:
            lr = nanogpt_lr(it, args.lr, warmup, max_iters)
        loss = step(lr)
        it += 1
        spent = time.perf_counter() - t0
        if it == 1:
            mark = (spent, 1)
        elif (
            replanning
            and max_iters is not None
            and it & (it - 1) == 0
            and not (it < warmup or it - warmup <= 0.2 * (max_iters - warmup))
        ):
            replanning = False  # the horizon stays
        elif (it == 4 and max_iters is None) or (
            replanning and max_iters is not None and it & (it - 1) == 0 and it > 4
        ):
            pace = (spent - mark[0]) / (it - mark[1])
            mark = (spent, it)
            max_iters = it + max(0, int((args.seconds - spent) / pace))
            warmup = warmup or min(100, max_iters // 5)
            max_iters = max(max_iters, warmup + 1)
        if it % 50 == 0 or it == max_iters:
            print(f"nanogpt iter {it}/{max_iters} loss {loss.item():.4f} {spent:.0f}s", flush=True)
    train_s = time.perf_counter() - t0

    model.eval()
    lines = (out / "heldout.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    n_params = sum(p.numel() for p in model.parameters())
    rows = [
        json.dumps(
            {
                "format": "bytelm-scores",
                "version": 1,
                "fingerprint": header["fingerprint"],
                "family": "nanogpt",
                "params": {"total": n_params},
            }
        )
    ]
    with torch.no_grad():
        for line in lines[1:]:
            seg = json.loads(line)
            ids = [BOS_ID] + [b + 4 for b in base64.b64decode(seg["bytes"])]
            x = torch.tensor([ids[:-1]])
            logits, _ = model(x, torch.tensor([ids[1:]]))  # with targets: logits at every position
            nll = torch.nn.functional.cross_entropy(logits[0], torch.tensor(ids[1:]), reduction="sum")
            rows.append(json.dumps({"id": seg["id"], "nats": float(nll), "global_steps": len(ids) - 1}))
    (out / "nanogpt_scores.jsonl").write_text("\n".join(rows) + "\n")
    (out / "nanogpt.json").write_text(
        json.dumps(
            {"train_s": train_s, "steps": max_iters, "warmup": warmup, "lr": args.lr, "params": n_params}
        )
    )
    print(f"nanogpt: {max_iters} steps in {train_s:.1f}s", flush=True)


# -- the race ------------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--nanogpt", required=True, help="a clone of github.com/karpathy/nanoGPT (its model.py is used)"
    )
    p.add_argument(
        "--data", required=True, help="corpus spec, e.g. files:tinyshakespeare.txt?split=paragraph"
    )
    p.add_argument("--seconds", type=float, default=600.0, help="training time of every model (default 600)")
    p.add_argument("--lr", type=float, default=3e-3, help="nanoGPT's peak learning rate (default 3e-3)")
    p.add_argument(
        "--family",
        action="append",
        choices=FAMILIES,
        help="bytelm families to train (repeatable; default all)",
    )
    p.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="FAMILY=PRESET",
        help="train FAMILY with PRESET instead of cpu/FAMILY (repeatable), e.g. byte=cpu/byte_10min",
    )
    p.add_argument("--out", default="runs/nanogpt_race", help="output directory (default runs/nanogpt_race)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    recipes = {f: f"cpu/{f}" for f in FAMILIES}
    for item in args.recipe:
        fam, _, preset = item.partition("=")
        if fam not in FAMILIES or not preset:
            p.error(f"--recipe {item!r}: use FAMILY=PRESET with FAMILY one of {', '.join(FAMILIES)}")
        recipes[fam] = preset
    out = Path(args.out)
    if args.worker:
        return nanogpt_worker(args)
    out.mkdir(parents=True, exist_ok=True)
    sets = [f"--set=data.source={args.data}"]

    # 1. the data both sides see
    from bytelm.config import load_config
    from bytelm.data import load_corpus_from_config

    corpus = load_corpus_from_config(load_config("cpu/byte", [f"data.source={args.data}"]).data)
    np.save(out / "train_ids.npy", np.asarray(corpus.train_stream))
    bytelm(
        "data",
        "export-heldout",
        "--config",
        "cpu/byte",
        "--data",
        args.data,
        "--out",
        str(out / "heldout.jsonl"),
    )

    # 2. nanoGPT
    if not (out / "nanogpt.json").is_file():
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                "--nanogpt",
                args.nanogpt,
                "--data",
                args.data,
                "--seconds",
                str(args.seconds),
                "--lr",
                str(args.lr),
                "--out",
                str(out),
            ],
            check=True,
        )
    nano = json.loads((out / "nanogpt.json").read_text())

    # 3. bytelm, every family for the same training time
    runs, run_recipe = [], {}
    for fam in args.family or FAMILIES:
        extra = []
        if fam == "blt":
            if not finished(out / "entropy"):
                bytelm("train", "cpu/entropy", "--out", str(out / "entropy"), *sets)
            extra = [f"--set=model.entropy_run={out / 'entropy'}"]
        if fam == "bpe":
            if not (out / "tokenizer" / "tokenizer.json").is_file():
                bytelm(
                    "tokenizer",
                    "train",
                    "--data",
                    args.data,
                    "--vocab-size",
                    "4096",
                    "--pattern",
                    "cl100k",
                    "--out",
                    str(out / "tokenizer"),
                )
            extra = [f"--set=model.tokenizer={out / 'tokenizer'}"]
        # a run directory per family and recipe: a finished run of another recipe is never reused
        run_dir = out / (fam if recipes[fam] == f"cpu/{fam}" else f"{fam}-{recipes[fam].replace('/', '-')}")
        if not finished(run_dir):
            bytelm(
                "train",
                recipes[fam],
                "--out",
                str(run_dir),
                "--minutes",
                f"{args.seconds / 60:.6g}",
                *sets,
                *extra,
            )
        runs.append(run_dir)
        run_recipe[run_dir.name] = recipes[fam]

    # 4. one table on one fingerprint
    bytelm(
        "eval",
        *map(str, runs),
        "--data",
        args.data,
        "--external",
        f"nanogpt={out / 'nanogpt_scores.jsonl'}",
        "--json",
        str(out / "report.json"),
    )
    report = json.loads((out / "report.json").read_text())
    bpb = {m["name"]: m["bpb"] for m in report["models"]}
    train_s = {r.name: json.loads((r / "run.json").read_text()).get("train_s") for r in runs}
    best = min((n for n in bpb if n != "nanogpt"), key=bpb.get)
    result = {
        "data": args.data,
        "seconds": args.seconds,
        "fingerprint": report["fingerprint"],
        "nanogpt_bpb": round(bpb["nanogpt"], 4),
        "nanogpt_train_s": round(nano["train_s"], 1),
        "nanogpt_steps": nano["steps"],
        "bytelm_bpb": {n: round(v, 4) for n, v in bpb.items() if n != "nanogpt"},
        "bytelm_train_s": {n: round(s, 1) for n, s in train_s.items() if s is not None},
        "recipes": run_recipe,
        "best": best,
        "best_ratio": round(bpb[best] / bpb["nanogpt"], 4),
    }
    print(json.dumps(result))
    if args.record:
        record("nanogpt_race", result)


if __name__ == "__main__":
    main()
