"""A rendezvous store whose values are authenticated with the job secret.

The job's TCPStore tells ranks where to connect (servers' and peers' addresses) and what to train
from (initial weights, optimizer settings, class switches). Anyone who can reach the store could
rewrite those values, so every value is stored as HMAC-SHA256(secret, "geryon-store" | key | value)
followed by the value, and a reader verifies the tag before using it: a value written without the
secret, or moved from another key, raises AuthenticationError naming the key. (Confidentiality is
not the goal: the values are addresses and a model's starting point, not the secret.)

`SignedStore(store, secret)` wraps any torch.distributed Store; set/get are signed, check and wait
pass through (they only test for a key's presence).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from datetime import timedelta

from geryon.errors import AuthenticationError

TAG_SIZE = 32
_DOMAIN = b"geryon-store\0"


def _tag(secret: bytes, key: str, value: bytes) -> bytes:
    name = key.encode()
    return hmac.new(secret, _DOMAIN + struct.pack("!I", len(name)) + name + value, hashlib.sha256).digest()


class SignedStore:
    """A Store whose set() signs and whose get() verifies each value with the job secret."""

    def __init__(self, store, secret: bytes | str):
        self.store = store
        self.secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        if not self.secret:
            raise AuthenticationError("a signed store needs the job secret")

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self.store.set(key, _tag(self.secret, key, data) + data)

    def get(self, key: str) -> bytes:
        raw = bytes(self.store.get(key))
        tag, data = raw[:TAG_SIZE], raw[TAG_SIZE:]
        if len(raw) < TAG_SIZE or not hmac.compare_digest(tag, _tag(self.secret, key, data)):
            raise AuthenticationError(
                f"the rendezvous store's value under {key!r} is not signed with this job's secret: "
                "someone without the secret wrote it (or a rank of another job shares the store); "
                "refusing to use it")
        return data

    def check(self, keys: list[str]) -> bool:
        return self.store.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.store.wait(keys)
        else:
            self.store.wait(keys, timeout)
