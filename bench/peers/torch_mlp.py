#!/usr/bin/env python3
"""The example's job written in PyTorch, for bench/peers/compare.py: the same MLP (784-256-128-10,
ReLU, cross-entropy), the same initial weights (--init: raw float32 from peers_export_init), the
same per-rank batch, SGD (lr 0.05, momentum 0.9) with the example's cosine schedule per epoch,
Fashion-MNIST standardised by the training split's mean and standard deviation. Batches are taken
from a seeded permutation split across ranks as DistributedSampler does (no DataLoader workers).

  torch_mlp.py --data DIR --init FILE [--ddp N] [--threads T] [--epochs E] [--batch-size B]

Prints per epoch `epoch e/E samples/s X test_accuracy A` (rank 0), then `first_step_s S`.
"""
import argparse
import gzip
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir):
    x = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz")).reshape(-1, 784).astype(np.float32) / 255
    y = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    tx = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")).reshape(-1, 784).astype(np.float32) / 255
    ty = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    mean, std = x.mean(), x.std()
    return [torch.from_numpy(a) for a in ((x - mean) / std, y, (tx - mean) / std, ty)]


def make_model(init_file):
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    flat = torch.from_numpy(np.fromfile(init_file, dtype=np.float32))
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n
    if offset != flat.numel():
        raise SystemExit(f"torch_mlp: {init_file} holds {flat.numel()} floats, the model {offset}")
    return model


def train(rank, world, args):
    if args.threads:
        torch.set_num_threads(args.threads)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    x, y, tx, ty = load(args.data)
    model = make_model(args.init)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    per_rank = len(x) // world
    steps = per_rank // args.batch_size
    first_step = None
    t_start = time.perf_counter()
    for epoch in range(args.epochs):
        for g in opt.param_groups:  # the example's cosine schedule, one value per epoch
            g["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * epoch / args.epochs))
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        mine = perm[rank:per_rank * world:world]
        t0 = time.perf_counter()
        for s in range(steps):
            idx = mine[s * args.batch_size:(s + 1) * args.batch_size]
            opt.zero_grad(set_to_none=False)
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
            if first_step is None:
                first_step = time.perf_counter() - t_start
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} samples/s {steps * args.batch_size * world / seconds:.0f} "
                  f"test_accuracy {acc:.4f}", flush=True)
    if rank == 0:
        print(f"first_step_s {first_step:.3f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--ddp", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    run(train, p.parse_args())


def run(train_fn, args):
    """train_fn(rank, world, args) on args.ddp processes over gloo (DDP), or in this process."""
    if args.ddp > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 20000))
        mp.spawn(train_fn, args=(args.ddp, args), nprocs=args.ddp)
    else:
        train_fn(0, 1, args)


if __name__ == "__main__":
    main()
