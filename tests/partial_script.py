"""A worker of the partial-allreduce tests: trains the example's CNN, ends with equal replicas.

Prints one JSON line per rank after geryon.average_replicas(): a digest of its parameters and the
model's loss on a fixed slice of the training set (the same on every rank once replicas are equal).
"""

import argparse
import hashlib
import json

import torch
import torch.nn.functional as F

import geryon
from geryon.examples.train_cnn import SmallCNN, make_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = geryon.init()
    images, labels = make_dataset(512, seed=0)
    torch.manual_seed(job.rank)    # different starting weights: the start must take rank 0's
    model = SmallCNN(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model, optimizer = geryon.distribute(model, optimizer)
    generator = torch.Generator().manual_seed(100 + job.rank)
    for _ in range(args.iterations):
        index = torch.randint(0, len(images), (args.batch_size,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(images[index]), labels[index]).backward()
        optimizer.step()
    geryon.average_replicas()
    module = model.module if hasattr(model, "module") else model
    with torch.no_grad():
        loss = F.cross_entropy(module(images[:256]), labels[:256]).item()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in module.parameters())).hexdigest()
    print("RESULT " + json.dumps({"rank": job.rank, "digest": digest, "loss": loss}), flush=True)


if __name__ == "__main__":
    main()
