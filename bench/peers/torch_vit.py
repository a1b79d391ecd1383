#!/usr/bin/env python3
"""The example ViT's job (bench_vit --train-epochs) written in PyTorch, for bench/peers/compare_vit.py.

The same model as models/vit_layers.hpp, written plainly: 7x7 patches (16 tokens) through a linear
projection plus learned positions, pre-norm blocks (nn.LayerNorm eps 1e-5, one fused qkv Linear
[3D, D], scaled dot-product softmax attention written out, output projection, MLP Linear -
GELU(approximate='tanh') - Linear), mean pool, LayerNorm, linear head. The same initial weights
(--init: raw float32 from peers_export_vit_init, in make_vit's order, each tensor's shape checked
against FILE.shapes), the same data (Fashion-MNIST as partrain's loader standardises it: x / 255,
then (x - 0.2860) / 0.3530 in float32), the same batches (partrain's permutation of seed + epoch,
ported below, rank r taking positions r, r + W, ... as DistributedSampler and views::distributed
do, batches of --batch-size with drop_last), AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
decay 0.01) and partrain's warmup_cosine_lr per step (5% warm-up, cosine to 0).

  torch_vit.py --data DIR --init FILE [--ddp N] [--threads T] [--epochs E] [--batch-size B]
  torch_vit.py --data DIR --init FILE --device cuda [--compile] [--epochs E]
  torch_vit.py --data DIR --init FILE --check-steps K

--device cuda trains one process on GPU 0 (the data moved there once), eagerly or, with
--compile, through torch.compile (its first steps compile: the epoch's samples/s skips them as
it skips the first 10 steps anywhere); tools/gpu_check.sh runs both beside the CUDA ViT.

Prints per epoch `epoch e/E samples/s X test_accuracy A train_loss L` (rank 0; samples/s of all
ranks after the epoch's first 10 steps), or with --check-steps, K AdamW steps at constant lr on
one process over the batches rank 0 of 2 reads in epoch 0: `check step k loss L` (bench_vit
--check-steps prints the same).
"""
import argparse
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_mlp import read_idx, run  # the same IDX reader and process launch as the MLP's

SKIP = 10  # steps of each epoch left out of its samples/s, as bench_vit
MASK = (1 << 64) - 1


# ---- data: as partrain reads and orders it ----

def standardise(u8):
    # partrain: float(pixel) * (1/255 in float), then (v - mean) * (1 / std in float).
    x = u8.reshape(len(u8), -1).astype(np.float32) * np.float32(1.0 / 255.0)
    return (x - np.float32(0.2860)) * (np.float32(1.0) / np.float32(0.3530))


def load(data_dir):
    x = standardise(read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz")))
    y = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    tx = standardise(read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")))
    ty = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in (x, y, tx, ty)]


def permutation(n, seed):
    """partrain's detail::data::permutation: splitmix64 from seed, unbiased bounded draws by
    rejection, Fisher-Yates from the back."""
    p = list(range(n))
    state = seed & MASK
    for i in range(n, 1, -1):
        threshold = ((1 << 64) - i) % i
        while True:
            state = (state + 0x9E3779B97F4A7C15) & MASK
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
            z ^= z >> 31
            if z >= threshold:
                break
        j = z % i
        p[i - 1], p[j] = p[j], p[i - 1]
    return p


def rank_batches(n, world, rank, batch, epoch, seed=0):
    """views::distributed(n, world, rank, {.shuffle, .seed, .drop_last = true}) batched with drop_last."""
    order = permutation(n, seed + epoch)
    per_rank = n // world
    mine = torch.tensor([order[rank + k * world] for k in range(per_rank)])
    return [mine[s * batch:(s + 1) * batch] for s in range(per_rank // batch)]


# ---- the model ----

class PatchEmbed(nn.Module):
    def __init__(self, image, patch, dim):
        super().__init__()
        self.image, self.patch, self.grid = image, patch, image // patch
        self.proj = nn.Linear(patch * patch, dim)
        self.pos = nn.Parameter(torch.zeros(self.grid * self.grid, dim))

    def forward(self, x):
        n, g, p = x.shape[0], self.grid, self.patch
        # patch (py, px) holds pixels (py p + r, px p + c), r-major: partrain's move_patches.
        patches = x.view(n, g, p, g, p).permute(0, 1, 3, 2, 4).reshape(n, g * g, p * p)
        return self.proj(patches) + self.pos


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.heads, self.dh = heads, dim // heads
        self.scale = 1.0 / math.sqrt(self.dh)
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        n, t, d = x.shape
        # qkv's columns: queries | keys | values, head h at h dh .. (h + 1) dh within each.
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        probs = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(n, t, d)
        x = x + self.proj(ctx)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, image=28, patch=7, dim=64, depth=4, heads=4, mlp_ratio=2, classes=10):
        super().__init__()
        self.embed = PatchEmbed(image, patch, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio * dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x.mean(dim=1)))

    def partrain_order(self):
        """The parameters in make_vit's order (what peers_export_vit_init writes)."""
        out = [self.embed.proj.weight, self.embed.proj.bias, self.embed.pos]
        for b in self.blocks:
            for m in (b.ln1, b.qkv, b.proj, b.ln2, b.fc1, b.fc2):
                out += [m.weight, m.bias]
        return out + [self.norm.weight, self.norm.bias, self.head.weight, self.head.bias]


def make_model(init_file):
    model = ViT()
    flat = torch.from_numpy(np.fromfile(init_file, dtype=np.float32))
    with open(init_file + ".shapes") as f:
        shapes = [tuple(int(v) for v in line.split()) for line in f if line.strip()]
    params = model.partrain_order()
    if len(shapes) != len(params) or len(params) != len(list(model.parameters())):
        raise SystemExit(f"torch_vit: {init_file}.shapes lists {len(shapes)} parameters, the model maps "
                         f"{len(params)} of {len(list(model.parameters()))}")
    offset = 0
    with torch.no_grad():
        for i, (p, s) in enumerate(zip(params, shapes)):
            if tuple(p.shape) != s:
                raise SystemExit(f"torch_vit: parameter {i} is {tuple(p.shape)} here, {s} in {init_file}")
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    if offset != flat.numel():
        raise SystemExit(f"torch_vit: {init_file} holds {flat.numel()} floats, the model {offset}")
    return model


def warmup_cosine(base, warmup, total, step):
    """partrain::warmup_cosine_lr with min 0."""
    if step < warmup:
        return base * (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / (total - warmup))
    return base * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(params, lr):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


# ---- runs ----

def check(args):
    x, y, _, _ = load(args.data)
    model = make_model(args.init)
    opt = make_optimizer(model.parameters(), args.lr)
    for k, idx in enumerate(rank_batches(len(x), 2, 0, args.batch_size, 0)[:args.check_steps]):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        print(f"check step {k} loss {loss.item():.7f}", flush=True)


def train(rank, world, args):
    if args.threads:
        torch.set_num_threads(args.threads)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device(args.device)
    x, y, tx, ty = (t.to(dev) for t in load(args.data))
    model = make_model(args.init).to(dev)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if args.compile:
        net = torch.compile(net)
    opt = make_optimizer(model.parameters(), args.lr)
    per_epoch = (len(x) // world) // args.batch_size
    total = per_epoch * args.epochs
    warmup = max(1, total // 20)
    step = 0
    for epoch in range(args.epochs):
        batches = [b.to(dev) for b in rank_batches(len(x), world, rank, args.batch_size, epoch)]
        loss_sum = 0.0
        t0 = time.perf_counter()
        for k, idx in enumerate(batches):
            if k == SKIP:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = warmup_cosine(args.lr, warmup, total, step)
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            step += 1
        seconds = time.perf_counter() - t0
        if rank == 0:
            with torch.no_grad():
                correct = sum((model(tx[i:i + 500]).argmax(1) == ty[i:i + 500]).sum().item() for i in range(0, len(tx), 500))
            rate = (len(batches) - min(len(batches), SKIP)) * args.batch_size * world / seconds
            print(f"epoch {epoch + 1}/{args.epochs} samples/s {rate:.0f} test_accuracy {correct / len(tx):.4f} "
                  f"train_loss {loss_sum / len(batches):.4f} (rank 0)", flush=True)
        if world > 1:
            dist.barrier()
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--ddp", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--check-steps", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    if args.device == "cuda" and args.ddp != 1:
        raise SystemExit("torch_vit: --device cuda trains one process (--ddp 1)")
    if args.check_steps > 0:
        check(args)
    else:
        run(train, args)


if __name__ == "__main__":
    main()
