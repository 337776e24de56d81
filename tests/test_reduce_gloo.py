"""TorchDistributedReducer over a real gloo group of 2 processes: unequal lists, the same JSON decision
on every rank, no pickling, and a rank-0 failure that ends the other rank's wait with a clear error."""

import datetime
import multiprocessing
import os


def _rank(rank: int, port: int, queue) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import pickle

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from geryon.categorize.reduce import TorchDistributedReducer
    from geryon.errors import ConfigError

    store = dist.TCPStore("127.0.0.1", port, 3, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    seen = []

    def refuse_pickle(*args, **kwargs):
        raise AssertionError("something was unpickled")

    # the reducer must not unpickle anything it received: not with pickle, not through the unpickler
    # torch.distributed's object collectives bound at import
    pickle.loads = pickle.Unpickler = distributed_c10d._unpickler = refuse_pickle
    try:
        reducer = TorchDistributedReducer()
        times = [[0.5, 0.25, 1.0], [0.125]][rank]
        first = reducer.decide(times, lambda everyone: (seen.append(everyone), {"next": (3, 4), "x": 0.1})[1])
        empty = reducer.decide([], lambda everyone: {"all": everyone})
        try:
            reducer.decide([1.0], lambda everyone: 1 / 0)
            failure = None
        except ZeroDivisionError:
            failure = "ZeroDivisionError"
        except ConfigError as error:
            failure = str(error)
        queue.put((rank, seen, first, empty, failure))
    finally:
        dist.destroy_process_group()


def test_reducer_over_gloo_without_pickle():
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, master.port, queue)) for rank in range(2)]
    for process in processes:
        process.start()
    try:
        results = dict((item[0], item[1:]) for item in (queue.get(timeout=120) for _ in processes))
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    seen0, first0, empty0, failure0 = results[0]
    seen1, first1, empty1, failure1 = results[1]
    assert seen0 == [[[0.5, 0.25, 1.0], [0.125]]] and seen1 == []     # only rank 0 decides
    assert first0 == first1 == {"next": [3, 4], "x": 0.1}                # JSON: the same value everywhere
    assert empty0 == empty1 == {"all": [[], []]}
    assert failure0 == "ZeroDivisionError"
    assert failure1 == "rank 0 could not decide (its error is in its own output)"
