"""Decision records in the control store, readable and writable only with the run's secret token.

``torch.distributed.TCPStore`` has no authentication: any process that reaches its port can list,
read, write and delete keys. The live executor therefore seals every decision record
(``ctl/{job}``) before it enters the store, with a per-run token (:func:`new_token`,
``secrets.token_hex``) that reaches the hub and the workers only through Ray (actor arguments):

    sealed = "s1." + base64url(nonce[16] || ciphertext || tag[32])
    enc_key = HMAC-SHA256(token, "jigsaw-store-enc"), mac_key = HMAC-SHA256(token, "jigsaw-store-mac")
    ciphertext = record_json XOR keystream, keystream block i = HMAC-SHA256(enc_key, nonce || i)
    tag = HMAC-SHA256(mac_key, "s1" || store key || 0x00 || nonce || ciphertext)

(encrypt-then-MAC with HMAC-SHA256 as the pseudo-random function, Python's standard library
only). The tag binds a record to its key, so a record of one job cannot be moved to another; a
record replayed under its own key carries an older ``seq`` and workers keep the newest they have
seen. A client without the token learns a record's length and nothing else, and any record it
writes fails :meth:`RecordSeal.open`. docs/security.md lists what sealing does not cover.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import Any

PREFIX = "s1."
TOKEN_BYTES = 32
_NONCE = 16
_TAG = 32


def new_token() -> str:
    """A fresh per-run secret: 32 random bytes as 64 hex characters."""
    return secrets.token_hex(TOKEN_BYTES)


class ForgedRecord(ValueError):
    """A store value that was not sealed with this run's token (or was altered)."""


class RecordSeal:
    """Seals and opens JSON records under one run's token (module docstring)."""

    def __init__(self, token: str):
        if not isinstance(token, str) or len(token) < 2 * TOKEN_BYTES:
            raise ValueError(f"store token: expected the run's secret ({2 * TOKEN_BYTES} hex characters from "
                             f"jigsaw_executor.store_seal.new_token), got {'nothing' if not token else 'a shorter one'}")
        key = token.encode("ascii")
        self._enc = hmac.new(key, b"jigsaw-store-enc", hashlib.sha256).digest()
        self._mac = hmac.new(key, b"jigsaw-store-mac", hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "RecordSeal(<secret>)"

    def _xor(self, nonce: bytes, data: bytes) -> bytes:
        """``data`` XOR the keystream of ``nonce`` (encryption and decryption alike)."""
        blocks = (len(data) + 31) // 32
        stream = b"".join(hmac.new(self._enc, nonce + i.to_bytes(8, "big"), hashlib.sha256).digest()
                          for i in range(blocks))[:len(data)]
        n = len(data)
        return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big") if n else b""

    def _tag(self, key: str, nonce: bytes, ct: bytes) -> bytes:
        return hmac.new(self._mac, b"s1" + key.encode() + b"\x00" + nonce + ct, hashlib.sha256).digest()

    def seal(self, key: str, record: Any) -> str:
        """The sealed text of a JSON-able ``record`` stored under ``key``."""
        nonce = secrets.token_bytes(_NONCE)
        ct = self._xor(nonce, json.dumps(record, separators=(",", ":")).encode())
        return PREFIX + base64.urlsafe_b64encode(nonce + ct + self._tag(key, nonce, ct)).decode("ascii")

    def open(self, key: str, sealed: bytes | str) -> Any:
        """The record sealed under ``key``; :class:`ForgedRecord` (one line naming the key) if
        it was not sealed with this token under this key, or was altered."""
        text = sealed.decode("ascii", "replace") if isinstance(sealed, (bytes, bytearray)) else str(sealed)
        forged = ForgedRecord(f"store key {key}: not a record sealed with this run's token (written by a "
                              f"process without it, or altered); ignored")
        if not text.startswith(PREFIX):
            raise forged
        try:
            raw = base64.urlsafe_b64decode(text[len(PREFIX):].encode("ascii"))
        except ValueError:
            raise forged from None
        if len(raw) < _NONCE + _TAG:
            raise forged
        nonce, ct, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(key, nonce, ct)):
            raise forged
        return json.loads(self._xor(nonce, ct))
