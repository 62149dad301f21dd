"""Signal (b), its protocol part: the plain Stratum V1 handshake in a connection's first
bytes.

A miner's first message to its pool, on a plain TCP connection, is a JSON-RPC request:

- Stratum V1 (Bitcoin and most coins since 2012; NiceHash's EthereumStratum/1.0.0;
  EIP-1571): `{"id": 1, "method": "mining.subscribe", "params": ["agent/1.0"]}`, then
  `mining.authorize` with `["wallet.worker", "password"]`; BIP 310 miners send
  `mining.configure` first, EIP-1571 ones `mining.hello`, and NiceHash's
  `mining.extranonce.subscribe` follows the subscription;
- the CryptoNote dialect (Monero pools, xmrig, xmr-stak): `{"id": 1, "jsonrpc": "2.0",
  "method": "login", "params": {"login": "wallet", "pass": "x", "agent": "XMRig/6.x",
  "algo": [...]}}`;
- EthProxy's (ethminer's stratum1): `{"method": "eth_submitLogin", "params": ["0x..."]}`.

`stratum_handshake` reads the first bytes of a connection's payload the way a pool does,
as consecutive JSON objects, whatever the whitespace between or inside them and
whatever the order of their fields, and tolerates the last one being cut off where
the captured bytes end. It matches only on an object's own top-level `method`: a
method name inside a string or a nested value (a notebook cell's code in a Jupyter
message, a file's text in a language server's `textDocument/didOpen`) is never
looked at. A `login` counts only with the CryptoNote login's own parameters (an
object holding `login` and `pass` or `agent`), so an ordinary JSON-RPC login
(`{"method": "login", "params": {"username": ..., "password": ...}}`) is not
Stratum. Payloads that do not start with a JSON object (HTTP, TLS, SSH, a language
server's `Content-Length:` header, Jupyter's binary websocket frames) are never read
further.

Not seen: Stratum inside TLS (`stratum+ssl://`, a pool's TLS port: only the address
and port list can see it), over a websocket, or Stratum V2 (binary and encrypted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The handshake's methods (a miner's first requests), matched on the method alone.
HANDSHAKE_METHODS = frozenset({
    "mining.subscribe", "mining.authorize", "mining.configure",
    "mining.extranonce.subscribe", "mining.hello", "eth_submitLogin",
})
# The CryptoNote login: this method with an object of params holding LOGIN_KEY and at
# least one of LOGIN_ALSO.
LOGIN_METHOD = "login"
LOGIN_KEY = "login"
LOGIN_ALSO = frozenset({"pass", "agent"})
_WHITESPACE = " \t\r\n\ufeff"
_DECODER = json.JSONDecoder()
_CUT = object()  # a value the captured bytes end inside


@dataclass(frozen=True)
class StratumRules:
    """What counts as the handshake, and how much of a payload is read."""

    methods: frozenset[str] = field(default_factory=lambda: HANDSHAKE_METHODS)
    # A miner's first message is 100-800 bytes (xmrig's login with its list of 40-odd
    # algorithms is the longest); 2 KiB holds it and a second one, and bounds the work
    # a connection can cost.
    max_bytes: int = 2048
    # The handshake is in the first messages: a miner sends configure, subscribe and
    # authorize back to back, and 4 is more than any sends before its pool's answer.
    max_messages: int = 4


@dataclass(frozen=True)
class StratumMatch:
    method: str  # the handshake method seen
    message: int  # which message of the payload it was in (0: the first)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _members(text: str, i: int, depth: int) -> tuple[dict[str, Any], int | None]:
    """The members of the JSON object starting at text[i] == "{", as far as they go:
    (members, the index after the object) or (members so far, None) where the text ends
    inside it or stops being JSON. An object value is read the same way down to `depth`
    (so a login's params cut off after its first keys still shows them); deeper values
    are decoded whole or not at all."""
    members: dict[str, Any] = {}
    i = _skip(text, i + 1)
    if i < len(text) and text[i] == "}":
        return members, i + 1
    while i < len(text):
        if text[i] != '"':
            return members, None
        try:
            key, i = json.decoder.scanstring(text, i + 1)
        except json.JSONDecodeError:
            return members, None
        i = _skip(text, i)
        if i >= len(text) or text[i] != ":":
            return members, None
        i = _skip(text, i + 1)
        if i >= len(text):
            return members, None
        if text[i] == "{" and depth > 1:
            value, end = _members(text, i, depth - 1)
            members[key] = value
            if end is None:
                return members, None
            i = end
        else:
            try:
                value, i = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                members[key] = _CUT
                return members, None
            members[key] = value
        i = _skip(text, i)
        if i >= len(text):
            return members, None
        if text[i] == "}":
            return members, i + 1
        if text[i] != ",":
            return members, None
        i = _skip(text, i + 1)
    return members, None


def _is_handshake(message: dict[str, Any], rules: StratumRules) -> str | None:
    method = message.get("method")
    if not isinstance(method, str):
        return None
    if method in rules.methods:
        return method
    if method == LOGIN_METHOD:
        params = message.get("params")
        if isinstance(params, dict) and isinstance(params.get(LOGIN_KEY), str) \
                and LOGIN_ALSO & params.keys():
            return method
    return None


def stratum_handshake(payload: bytes, rules: StratumRules = StratumRules()
                      ) -> StratumMatch | None:
    """The Stratum handshake in a connection's first bytes, or None."""
    text = payload[:rules.max_bytes].decode("utf-8", errors="replace")
    i = _skip(text, 0)
    for n in range(rules.max_messages):
        if i >= len(text) or text[i] != "{":
            return None
        message, end = _members(text, i, depth=2)
        method = _is_handshake(message, rules)
        if method is not None:
            return StratumMatch(method, n)
        if end is None:
            return None
        i = _skip(text, end)
    return None
