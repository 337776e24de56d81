"""The priority benchmark's two roles: S servers stream low-priority bulk to one worker, then answer
high-priority bursts; the worker times each burst (request to last byte).

This is the paper's scenario: end-host scheduling (`endhost`) orders each server's own queue, but
bulk from the other servers still competes with the burst in the switch; under `geryon` the burst
travels on the class-0 flow marked DSCP 46 and the switch's strict-priority queue lets it pass.
Bursts are split over the servers like PS slices (whole, from server 0, under `vanilla`).

Requests are PULL control frames: tensor 0 = start the bulk, tensor 1 = burst number `iteration`,
tensor 2 = stop the bulk. The bulk keeps `--backlog-bytes` queued at each server (frames are re-queued
as they are sent), like a framework that has already handed the transport large low-priority tensors;
under FIFO policies a burst waits behind that backlog.
"""

from __future__ import annotations

import json
import time

import torch

from geryon.errors import ProtocolError
from geryon.transport.flows import FlowPool, next_sequence
from geryon.transport.wire import Kind, dtype_code, encode_control, encode_header, slice_view

BULK, BURST, STOP = 0, 1, 2
_U8 = dtype_code(torch.uint8)


def _emit(**record) -> None:
    print(json.dumps(record), flush=True)


class _BenchServer:
    def __init__(self, args, config):
        self.args, self.config, self.policy = args, config, config.scheduling
        self.piece = config.slice_bytes if self.policy.sliced else 4 << 20
        self.data = torch.zeros(max(self.piece, args.burst_bytes), dtype=torch.uint8)
        self.stopped = False

    def _send(self, flow_to, tensor, offset, length, priority, urgency, epoch, on_sent=None):
        header = encode_header(Kind.PARAM, job_id=self.config.job_id, iteration=epoch, tensor_id=tensor,
                               offset=offset, length=length, dtype=_U8, priority=priority)
        key = self.policy.send_key(0, priority, urgency, next_sequence())
        flow_to(self.policy.flow_of(priority)).send(key, header, slice_view(self.data, 0, length),
                                                    on_sent=on_sent)

    def _bulk_frame(self, flow_to) -> None:
        """One bulk frame; when it is sent, the next one is queued (the backlog stays constant)."""
        if self.stopped:
            return
        self._send(flow_to, BULK, 0, self.piece, 1, 1000, 0, on_sent=lambda: self._bulk_frame(flow_to))

    def control(self, flow, header, payload):
        if header.kind != Kind.PULL:
            raise ProtocolError("bench server takes PULL only")
        flow_to = lambda index: flow.pool.flow(flow.peer_id, index)  # noqa: E731
        args, servers = self.args, int(self.args.servers)
        if header.tensor_id == STOP:
            self.stopped = True
            return
        if header.tensor_id == BULK:
            for _ in range(max(1, args.backlog_bytes // self.piece)):
                self._bulk_frame(flow_to)
            return
        if not self.policy.spread_over_servers:
            if args.index == 0:
                self._send(flow_to, BURST, 0, args.burst_bytes, 0, 0, header.iteration)
            return
        share = [(o, min(self.piece, args.burst_bytes - o))
                 for o in range(0, args.burst_bytes, self.piece)][args.index::servers]
        for offset, length in share:
            self._send(flow_to, BURST, offset, length, 0, 0, header.iteration)

    def destination(self, flow, header):
        raise ProtocolError("bench server takes no data")

    def delivered(self, flow, header):
        pass


def run_server(args) -> None:
    from geryon.bench.transport_roles import transport_config
    config = transport_config(args)
    host, port = args.listen.rsplit(":", 1)
    handler = _BenchServer(args, config)
    pool = FlowPool(args.index, config, handler, listen=(host, int(port)), peer_label="worker")
    _emit(event="ready", index=args.index)
    try:
        with pool.cond:
            while not pool.departed():
                pool.cond.wait(0.2)
    finally:
        pool.close(say_goodbye=False)


class _BenchWorker:
    def __init__(self, burst_bytes, piece):
        self.burst = torch.empty(burst_bytes, dtype=torch.uint8)
        self.sink = torch.empty(max(piece, 4 << 20), dtype=torch.uint8)
        self.burst_got = 0
        self.bulk_got = 0
        self.epoch = -1

    def tensor_numel(self, tensor_id):
        return {BULK: self.sink.numel(), BURST: self.burst.numel()}.get(tensor_id)

    def control(self, flow, header, payload):
        raise ProtocolError("bench worker takes no control frames")

    def destination(self, flow, header):
        if header.tensor_id == BULK:
            return slice_view(self.sink, 0, header.length)
        if header.iteration != self.epoch:
            raise ProtocolError(f"burst {header.iteration} while timing burst {self.epoch}")
        return slice_view(self.burst, header.offset, header.length)

    def delivered(self, flow, header):
        with flow.pool.cond:
            if header.tensor_id == BULK:
                self.bulk_got += header.length
            else:
                self.burst_got += header.length
            flow.pool.cond.notify_all()


def run_worker(args) -> None:
    from geryon.bench.transport_roles import parse_addresses, transport_config
    config = transport_config(args)
    servers = parse_addresses(args.servers)
    piece = config.slice_bytes if config.scheduling.sliced else 4 << 20
    handler = _BenchWorker(args.burst_bytes, piece)
    pool = FlowPool(10_000, config, handler, listen=None, peer_label="server")
    try:
        for index, address in enumerate(servers):
            pool.connect(index, address)
        _emit(event="ready")
        request = lambda tensor, epoch: [  # noqa: E731
            pool.flow(s, 0).send((0,), encode_control(Kind.PULL, b"", job_id=config.job_id,
                                                      iteration=epoch, tensor_id=tensor))
            for s in range(len(servers))]
        if args.bulk:
            request(BULK, 0)
            time.sleep(1.5)                      # let the bulk saturate the downlink
        times = []
        for k in range(args.repeat):
            with pool.cond:
                handler.epoch, handler.burst_got = k, 0
            started = time.monotonic()
            request(BURST, k)
            pool.wait_until(lambda: handler.burst_got >= args.burst_bytes, f"burst {k}",
                            list(range(len(servers))), progress=lambda: started, timeout=args.timeout)
            times.append(time.monotonic() - started)
            time.sleep(0.3)
        if args.bulk:
            request(STOP, 0)
        _emit(event="result", policy=config.policy, bulk=bool(args.bulk), burst_bytes=args.burst_bytes,
              seconds=sorted(times)[len(times) // 2], all_seconds=times, bulk_bytes_seen=handler.bulk_got)
    finally:
        pool.close(say_goodbye=True)
