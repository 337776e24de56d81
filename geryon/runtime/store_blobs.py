"""Values larger than the job's TCPStore takes in one message (8 MiB in torch's libuv store).

`put_blob(store, key, data)` writes `data` in chunks under `key/chunk/<i>` and then, last, the
number of chunks under `key` itself, so a reader that sees `key` (store.check, store.get) knows
every chunk is there; `get_blob(store, key)` waits for `key` and joins the chunks.
"""

CHUNK_BYTES = 4 << 20


def put_blob(store, key: str, data: bytes) -> None:
    """Store `data` under `key`, in chunks the store accepts; `key` appears last."""
    chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    for index, chunk in enumerate(chunks):
        store.set(f"{key}/chunk/{index}", chunk)
    store.set(key, str(len(chunks)))


def get_blob(store, key: str) -> bytes:
    """The data put_blob stored under `key` (waits for it like store.get)."""
    count = int(store.get(key).decode())
    return b"".join(store.get(f"{key}/chunk/{index}") for index in range(count))
