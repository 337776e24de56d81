"""Header bytes per link of one 8-rank 100 MB ring allreduce in 256 KiB pieces (loopback, ranks as
threads; sixteenth session): 5880 bytes = 14 full headers (one per ring step) + 658 continuations,
against 672 x 44 = 29568 with full headers only. Run from the repository root."""
import torch
import sys
sys.path.insert(0, "tests")
from transport_support import serve_world_of_threads
from geryon.transport.config import TransportConfig
world, size = 8, int(1e8)
cfg = TransportConfig(secret="t", timeout=120, max_slice_bytes=256 * 1024)
def body(g):
    t = torch.ones(size // 4)
    g.allreduce([t])
    before = {k: f.bytes_sent for k, f in g.pool.flows.items()}
    g.allreduce([t])
    return sum(f.bytes_sent - before[k] for k, f in g.pool.flows.items())
sent = serve_world_of_threads(world, cfg, body)
payload = 2 * (world - 1) * size / world
pieces = payload / (256 * 1024)
for s in sent:
    hdr = s - payload
    # hdr = n_full*44 + n_cont*8, n_full + n_cont = n
    print("header bytes %.0f, pieces ~%.0f, full headers ~%.1f" % (hdr, pieces, (hdr - 8 * pieces) / 36))
