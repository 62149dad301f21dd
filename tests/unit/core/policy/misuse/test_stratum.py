"""Signal (b), the protocol: the plain Stratum V1 handshake in a connection's first bytes,
and the ordinary JSON-RPC and Jupyter traffic it must never be taken for."""

from __future__ import annotations

import json

import pytest

from gpulease.core.policy.misuse.stratum import StratumMatch, StratumRules, stratum_handshake

XMRIG_LOGIN = (b'{"id":1,"jsonrpc":"2.0","method":"login","params":{"login":"4AdUndXHHZ6cfufTMvppY6'
               b'JwXNouMBzSkbLYfpAV5Usx3skxNgYeYTRj5UzqtReoS44qo9mtmXCqY45DJ852K5Jv2684Rge",'
               b'"pass":"x","agent":"XMRig/6.21.0 (Linux x86_64) libuv/1.44.2 gcc/11.4.0",'
               b'"algo":["cn/1","cn/2","cn/r","cn/fast","cn/half","cn/xao","cn/rto","cn/rwz",'
               b'"cn/zls","cn/double","cn/ccx","cn-lite/1","cn-heavy/0","cn-heavy/tube",'
               b'"cn-heavy/xhv","cn-pico","cn-pico/tlo","cn/upx2","rx/0","rx/wow","rx/arq",'
               b'"rx/graft","rx/sfx","rx/keva","argon2/chukwa","argon2/chukwav2","argon2/ninja",'
               b'"astrobwt/v2","ghostrider"]}}\n')


@pytest.mark.parametrize("payload, method", [
    (b'{"id": 1, "method": "mining.subscribe", "params": ["cgminer/4.12.0"]}\n',
     "mining.subscribe"),
    (b'{"id":2,"method":"mining.authorize","params":["bc1qwallet.rig1","x"]}\n',
     "mining.authorize"),
    # BIP 310: configure first, then subscribe on the same line-delimited stream
    (b'{"id":1,"method":"mining.configure","params":[["version-rolling"],'
     b'{"version-rolling.mask":"1fffe000","version-rolling.min-bit-count":2}]}\n'
     b'{"id":2,"method":"mining.subscribe","params":["bmminer/2.0.0"]}\n', "mining.configure"),
    # NiceHash's EthereumStratum/1.0.0 and EIP-1571
    (b'{"id": 1, "method": "mining.subscribe", "params": ["ethminer/0.19.0", '
     b'"EthereumStratum/1.0.0"]}\n', "mining.subscribe"),
    (b'{"id":0,"jsonrpc":"2.0","method":"mining.hello","params":{"agent":"x/1","host":"p",'
     b'"port":"4d2","proto":"EthereumStratum/2.0.0"}}\n', "mining.hello"),
    # EthProxy (ethminer's stratum1)
    (b'{"id":1,"jsonrpc":"2.0","method":"eth_submitLogin","params":["0xabc","x"],'
     b'"worker":"rig"}\n', "eth_submitLogin"),
    (XMRIG_LOGIN, "login"),
])
def test_a_miners_first_message_is_the_handshake(payload, method):
    assert stratum_handshake(payload) == StratumMatch(method, 0)


def test_field_order_and_whitespace_do_not_matter():
    reordered = b'{"params":{"agent":"XMRig/6.21.0","pass":"x","login":"4Ad"},"method":"login","id":1}'
    assert stratum_handshake(reordered) == StratumMatch("login", 0)
    pretty = json.dumps({"params": ["w.rig", "x"], "id": 7, "method": "mining.authorize"},
                        indent=4).encode()
    assert stratum_handshake(b"\r\n  " + pretty.replace(b"\n", b"\r\n")) == StratumMatch(
        "mining.authorize", 0)
    two_on_a_line = (b'{"id":1,"method":"client.get_version","params":[]}'
                     b'{"id":2,"method":"mining.subscribe","params":[]}')
    assert stratum_handshake(two_on_a_line) == StratumMatch("mining.subscribe", 1)
    escaped = b'{"method":"mining.subscrib\\u0065","params":[]}'
    assert stratum_handshake(escaped) == StratumMatch("mining.subscribe", 0)


def test_a_login_cut_off_where_the_capture_ends_still_counts():
    for end in (200, 240, 400):
        assert stratum_handshake(XMRIG_LOGIN[:end]) == StratumMatch("login", 0), end
    # cut before the login's own keys: not enough to say
    assert stratum_handshake(XMRIG_LOGIN[:60]) is None
    # a handshake method seen whole even though the message is cut after it
    assert stratum_handshake(b'{"id":1,"method":"mining.subscribe","params":["cgmi') == \
        StratumMatch("mining.subscribe", 0)


JUPYTER_EXECUTE = json.dumps({
    "header": {"msg_id": "a1", "msg_type": "execute_request", "username": "ada",
               "session": "s1", "version": "5.3", "date": "2026-12-01T10:00:00Z"},
    "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
    "content": {"code": 'line = \'{"id":1,"method":"mining.subscribe","params":[]}\'\n'
                        'json.loads(line)["method"]', "silent": False}}).encode()
LSP_DID_OPEN = json.dumps({
    "jsonrpc": "2.0", "method": "textDocument/didOpen",
    "params": {"textDocument": {"uri": "file:///home/ada/pool.py", "languageId": "python",
                                "version": 1,
                                "text": 'send({"method": "login", "params": {"login": "w", '
                                        '"pass": "x"}})\nsend({"method": "mining.authorize"})'}}
}).encode()


@pytest.mark.parametrize("payload", [
    # Jupyter's kernel protocol over its websocket, a cell that handles Stratum as data
    JUPYTER_EXECUTE,
    json.dumps({"header": {"msg_type": "comm_msg"}, "content": {
        "data": {"method": "update", "state": {"value": "mining.subscribe"}}}}).encode(),
    # a language server's messages (jupyter-lsp), bare and with their header
    json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"processId": None, "rootUri": "file:///home/ada"}}).encode(),
    LSP_DID_OPEN,
    b"Content-Length: 52\r\n\r\n" + json.dumps({"jsonrpc": "2.0", "id": 1,
                                                "method": "mining.subscribe"}).encode(),
    # ordinary JSON-RPC logins and other methods
    b'{"jsonrpc":"2.0","id":1,"method":"login","params":{"username":"ada","password":"pw"}}\n',
    b'{"jsonrpc":"2.0","id":1,"method":"login","params":["ada","pw"]}\n',
    b'{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xabc","latest"]}\n',
    b'{"method":"notify","params":{"method":"mining.subscribe"}}\n',
    # a JSON-RPC batch: no pool takes one
    b'[{"id":1,"method":"mining.subscribe","params":[]}]\n',
    # what else leaves a server: HTTP (even with Stratum in its body), TLS, SSH, nothing
    b'POST /rpc HTTP/1.1\r\nHost: x\r\n\r\n{"id":1,"method":"mining.subscribe"}',
    b"GET /simple/torch/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
    bytes.fromhex("160301020001000200fc0303") + b"\x00" * 40,
    b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n",
    b"", b"   \n", b"\xff\xfe\x00garbage{",
    b'{"id":1,"Method":"mining.subscribe"}',  # not the member a pool reads
])
def test_ordinary_traffic_is_never_stratum(payload):
    assert stratum_handshake(payload) is None


def test_only_the_first_bytes_and_messages_are_read():
    late = b'{"id":1,"method":"hello","params":["' + b"a" * 3000 + b'"]}\n' + \
        b'{"id":2,"method":"mining.subscribe","params":[]}\n'
    assert stratum_handshake(late) is None
    assert stratum_handshake(late, StratumRules(max_bytes=8192)) == StratumMatch(
        "mining.subscribe", 1)
    chatter = b'{"id":0,"method":"x"}\n' * 4 + b'{"id":9,"method":"mining.subscribe"}\n'
    assert stratum_handshake(chatter) is None
    assert stratum_handshake(chatter, StratumRules(max_messages=5)) == StratumMatch(
        "mining.subscribe", 4)


def test_the_methods_are_the_rules_to_set():
    only_v1 = StratumRules(methods=frozenset({"mining.subscribe"}))
    assert stratum_handshake(b'{"method":"mining.hello"}', only_v1) is None
    assert stratum_handshake(b'{"method":"mining.subscribe"}', only_v1) is not None
