"""The simulated week bench/misuse.py replays: its classes, its fixed parameters and each
server's life (processes, connections and their first bytes, GPU activity, clients).

Every CAPITAL here, the processes, payloads and lists were fixed when the benchmark was
written, before its first run and before any rule's threshold was tuned (bench/misuse.py
says what each class is); a later change to them is a new benchmark and says so in
bench/README.md.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulease.core.policy.misuse.network import (  # noqa: E402
    Connection,
    NetworkDenyList,
    NetworkEntry,
)
from gpulease.core.policy.misuse.processes import (  # noqa: E402
    ProcessDenyList,
    ProcessEntry,
    ProcessRecord,
)

# --- the fixed parameters ---------------------------------------------------------------
MIN, HOUR, DAY = 60.0, 3600.0, 86400.0
WEEK = 7 * DAY
HONEST = ("training", "unattended", "inference", "idle")
MINERS = ("named", "renamed", "changed_binary", "tls_pool", "throttled")
VISIBLE = ("named", "renamed", "changed_binary", "throttled")  # a process or payload signal
CLASSES = {  # servers a week at --scale 1
    "training": 600, "unattended": 300, "inference": 150, "idle": 400,
    "named": 60, "renamed": 60, "changed_binary": 60, "tls_pool": 60, "throttled": 60,
}
READING_S = 60.0  # the culler's GPU readings
STOP_LATENCY_S = 5.0  # a scan's decision to the server's processes gone (cgroup killed)
CAPTURE_LOSS = 0.02  # connections whose first bytes the capture missed
POOL_LISTED_SHARE = 0.6  # miners whose pool is a public one on the admin's address list
RELEASE_LISTED_SHARE = 0.8  # release binaries whose hash is on the admin's list
MINER_KEEPS_CLIENT = 0.3  # miners that keep a browser tab or a poller connected
MINER_URL_ON_CMDLINE = 0.6  # named miners given the pool on the command line (else a file)
MINER_SETUP_S = (60.0, 900.0)  # server start to the miner's start
MINER_CONNECT_S = (0.2, 5.0)  # the miner's start to its pool connection
MINER_RECONNECT_H = (1.0, 6.0)  # a pool connection's life before the miner reconnects
MINER_RUNS_H = (4.0, 24.0)  # how long a miner nobody stops runs
THROTTLED_PERCENT = (45.0, 55.0)
CMDLINE_CONFUSER = 0.05  # honest servers running a command line that names "miner" etc.
PORT_CONFUSER = 0.03  # ... connecting to Selenium Grid, Flower or a dev server on 3333
JSONRPC_CONFUSER = 0.05  # ... speaking JSON-RPC on plain TCP (a language server, a login)
JUPYTER_JSON_CONFUSER = 0.01  # ... sending Jupyter messages whose cell code holds Stratum
UNREADABLE_EXE = 0.02  # processes whose executable could not be read (no hash)
LUNCH_AWAY = 0.3  # training sessions whose researcher leaves a run going for a while
INFERENCE_LOAD_TEST = 0.2  # inference sessions with a load test run from inside
LISTED_FILLER_ADDRESSES = 2000  # further pool addresses on the admin's list
LISTED_FILLER_HASHES = 200  # further miner hashes on the admin's list
RESOLVER = "10.213.0.1"  # the sandbox's host end: DNS, the hub API


def sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


# Miner software: (name, release hash listed, a newer release not listed, dialect).
MINER_SOFTWARE = (
    ("xmrig", sha("xmrig-6.21.0"), sha("xmrig-6.22.2"), "login"),
    ("t-rex", sha("t-rex-0.26.8"), sha("t-rex-0.26.9"), "subscribe"),
    ("lolMiner", sha("lolMiner-1.88"), sha("lolMiner-1.91"), "configure"),
    ("nbminer", sha("nbminer-42.3"), sha("nbminer-42.4"), "ethstratum"),
)


def process_deny_list() -> ProcessDenyList:
    entries = [ProcessEntry(f"release-{name.lower()}", sha256=listed,
                            description=f"{name}'s release binary") for name, listed, _, _
               in MINER_SOFTWARE]
    entries += [ProcessEntry(f"hash-{n}", sha256=sha(f"filler-miner-{n}"))
                for n in range(LISTED_FILLER_HASHES)]
    entries += [
        ProcessEntry("stratum-url", pattern=r"stratum\d?\+(?:tcp|ssl|tls)://"),
        ProcessEntry("miner-names", pattern=r"(?:^|[\s/])(?:xmrig|t-rex|lolminer|nbminer|"
                     r"gminer|teamredminer|nanominer|phoenixminer|ethminer|srbminer-multi)"
                     r"(?:\s|$)"),
        ProcessEntry("donate-level", pattern=r"--donate-level\b"),
        ProcessEntry("miner-exe", pattern=r"/(?:xmrig|t-rex|lolminer|nbminer)$", target="exe"),
    ]
    return ProcessDenyList(tuple(entries))


@dataclass(frozen=True)
class Pool:
    address: str
    listed: bool


def pools(rng: random.Random) -> list[Pool]:
    """100 pools: the public ones' addresses on the admin's list, the others not."""
    out = []
    for n in range(100):
        address = f"198.18.{n // 200}.{n % 200 + 1}"
        out.append(Pool(address, rng.random() < POOL_LISTED_SHARE))
    return out


def network_deny_list(all_pools: list[Pool]) -> NetworkDenyList:
    entries = [NetworkEntry(f"pool-{n}", (p.address,)) for n, p in enumerate(all_pools)
               if p.listed]
    entries += [NetworkEntry(f"pool-filler-{n}", (f"100.{64 + n // 65536 % 64}."
                                                  f"{n // 256 % 256}.{n % 256}",))
                for n in range(LISTED_FILLER_ADDRESSES)]
    entries += [NetworkEntry(f"pool-net-{n}", (f"192.0.{n}.0/28",)) for n in range(10)]
    entries.append(NetworkEntry("miner-ports", ports=(3333, 4444, 5555, 7777, 14444, 14433,
                                                      45700)))
    return NetworkDenyList(tuple(entries))


# --- a server's life ----------------------------------------------------------------------
@dataclass
class Server:
    klass: str
    user: str
    start: float
    end: float
    procs: list[tuple[float, float, ProcessRecord]] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)
    gpu: list[tuple[float, float, float, float]] = field(default_factory=list)  # t0 t1 lo hi
    clients: list[tuple[float, float]] = field(default_factory=list)  # a client connected
    mining_from: float | None = None


@dataclass
class Outcome:
    stopped_at: float | None = None
    action: str | None = None
    kinds: tuple[str, ...] = ()
    warnings: int = 0
    warn_kinds: set[str] = field(default_factory=set)


PY = "/usr/local/bin/python3.11"


def _proc(rng: random.Random, pid: int, exe: str | None, digest: str | None,
          *argv: str) -> ProcessRecord:
    if rng.random() < UNREADABLE_EXE:
        return ProcessRecord(pid, None, None, argv)
    return ProcessRecord(pid, exe, digest, argv)


def _base(rng: random.Random, s: Server, pids: list[int]) -> None:
    """What every server runs: the notebook server, a kernel, a shell."""
    def pid() -> int:
        pids[0] += 1
        return pids[0]
    s.procs.append((s.start, s.end, _proc(rng, pid(), PY, sha("python3.11"), PY,
                                          "/usr/local/bin/jupyterhub-singleuser",
                                          "--ip=0.0.0.0", "--port=8888")))
    s.procs.append((s.start + 5, s.end, _proc(
        rng, pid(), PY, sha("python3.11"), "python", "-m", "ipykernel_launcher", "-f",
        f"/home/{s.user}/.local/share/jupyter/runtime/kernel-{rng.getrandbits(32):08x}.json")))
    if rng.random() < 0.5:
        s.procs.append((s.start + 30, s.end, _proc(rng, pid(), "/usr/bin/bash", sha("bash"),
                                                   "/bin/bash", "-l")))


def _tls() -> bytes:
    return bytes.fromhex("160301020001000200fc0303") + bytes(range(32))


TRAIN_COMMANDS = (
    ("python", "train.py", "--config", "configs/vit-b16.yaml"),
    ("torchrun", "--nproc_per_node=1", "train.py", "--model", "llama-3.2-1b", "--bf16"),
    ("accelerate", "launch", "finetune.py", "--lora_r", "16"),
    ("python", "-m", "lightning", "fit", "--config", "unet.yaml"),
    ("deepspeed", "train_gpt.py", "--deepspeed_config", "ds_zero2.json"),
    ("python", "run_clm.py", "--model_name_or_path", "gpt2", "--do_train"),
)
SERVE_COMMANDS = (
    ("vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"),
    ("python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-7B-Instruct"),
    ("text-generation-launcher", "--model-id", "mistralai/Mistral-7B-Instruct-v0.3"),
    ("tritonserver", "--model-repository=/home/model_repo"),
)
CONFUSER_COMMANDS = (
    ("python", "train_metric.py", "--miner", "MultiSimilarityMiner", "--loss", "triplet"),
    ("python", "-m", "minerl.env", "--seed", "3"),
    ("python", "data_miner.py", "--source", "s3://corpus/text"),
    ("grep", "-rn", "stratum", "notes/"),
    ("python", "analyse_pools.py", "--input", "pool_stats.parquet"),
    ("pip", "install", "pytorch-metric-learning", "minerl"),
)
SHORT_COMMANDS = (
    ("pip", "install", "-r", "requirements.txt"),
    ("git", "clone", "https://github.com/karpathy/nanoGPT"),
    ("nvidia-smi",),
    ("huggingface-cli", "download", "meta-llama/Llama-3.2-1B"),
    ("wget", "https://example.org/data/imagenet-val.tar"),
    ("tensorboard", "--logdir", "runs"),
)


def _honest_extras(rng: random.Random, s: Server, pids: list[int]) -> None:
    """Short commands now and then, downloads, and the class's confusers."""
    t = s.start + rng.uniform(60, 600)
    while t < s.end:
        argv = rng.choice(SHORT_COMMANDS)
        pids[0] += 1
        s.procs.append((t, t + rng.uniform(0.2, 120), _proc(
            rng, pids[0], PY if argv[0] in ("pip", "huggingface-cli", "tensorboard")
            else f"/usr/bin/{argv[0]}", sha(argv[0]), *argv)))
        t += rng.expovariate(1 / (20 * MIN))
    downloads = [("151.101.0.223", 443), ("18.164.174.72", 443), ("140.82.121.4", 22)]
    for address, port in downloads:
        at = s.start + rng.uniform(30, 1800)
        if at < s.end:
            payload = b"SSH-2.0-OpenSSH_9.6\r\n" if port == 22 else _tls()
            s.conns.append(Connection(address, port, at=at, first_bytes=payload))
    if rng.random() < CMDLINE_CONFUSER:
        pids[0] += 1
        at = rng.uniform(s.start, s.end)
        s.procs.append((at, min(s.end, at + rng.uniform(60, 4 * HOUR)), _proc(
            rng, pids[0], PY, sha("python3.11"), *rng.choice(CONFUSER_COMMANDS))))
    if rng.random() < PORT_CONFUSER:
        port, payload = rng.choice(((4444, b"POST /session HTTP/1.1\r\nHost: grid\r\n\r\n"),
                                    (5555, b"GET /api/workers HTTP/1.1\r\n\r\n"),
                                    (3333, b"GET / HTTP/1.1\r\nHost: dev\r\n\r\n")))
        s.conns.append(Connection(f"192.0.2.{rng.randint(20, 250)}", port,
                                  at=rng.uniform(s.start, s.end), first_bytes=payload))
    if rng.random() < JSONRPC_CONFUSER:
        payload = rng.choice((
            b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"processId":null,'
            b'"rootUri":"file:///home/ada","capabilities":{}}}',
            b'{"jsonrpc":"2.0","id":1,"method":"login","params":{"username":"ada",'
            b'"password":"secret"}}\n',
            b'{"jsonrpc":"2.0","id":3,"method":"textDocument/didOpen","params":{"textDocument":'
            b'{"uri":"file:///home/ada/pool.py","text":"send({\\"method\\": \\"login\\", '
            b'\\"params\\": {\\"login\\": \\"w\\", \\"pass\\": \\"x\\"}})"}}}',
        ))
        s.conns.append(Connection(RESOLVER, rng.choice((2087, 8081, 9000)),
                                  at=rng.uniform(s.start, s.end), first_bytes=payload))
    if rng.random() < JUPYTER_JSON_CONFUSER:
        message = {"header": {"msg_id": "1", "msg_type": "execute_request"}, "parent_header": {},
                   "metadata": {}, "channel": "shell",
                   "content": {"code": 'conn.send(b\'{"id":1,"method":"mining.subscribe",'
                                       '"params":[]}\\n\')', "silent": False}}
        s.conns.append(Connection(f"192.0.2.{rng.randint(20, 250)}", 8888,
                                  at=rng.uniform(s.start, s.end),
                                  first_bytes=json.dumps(message).encode()))


def _honest(rng: random.Random, klass: str, n: int, user: str) -> Server:
    start = rng.uniform(0, WEEK)
    pids = [1000]
    if klass == "training":
        s = Server(klass, user, start, min(WEEK, start + rng.uniform(1, 8) * HOUR))
        s.clients.append((s.start, s.end))
        t = s.start + rng.uniform(2, 15) * MIN
        while t < s.end:  # cells that run for a while, then reading and editing
            run = rng.uniform(5, 60) * MIN
            s.gpu.append((t, t + run, 92.0, 100.0))
            pids[0] += 1
            s.procs.append((t, t + run, _proc(rng, pids[0], PY, sha("python3.11"),
                                              *rng.choice(TRAIN_COMMANDS))))
            t += run + rng.uniform(2, 20) * MIN
        if rng.random() < LUNCH_AWAY:  # away with a run going
            away = rng.uniform(s.start, s.end)
            length = rng.uniform(30, 120) * MIN
            s.clients = [(s.start, away), (away + length, s.end)]
            s.gpu.append((away, away + length, 93.0, 100.0))
    elif klass == "unattended":
        job = rng.uniform(2, 24) * HOUR
        left = rng.uniform(10, 40) * MIN
        s = Server(klass, user, start, min(WEEK, start + left + job + 30 * MIN))
        s.clients.append((s.start, s.start + left))
        s.gpu.append((s.start + rng.uniform(3, 8) * MIN, s.start + left + job, 93.0, 100.0))
        pids[0] += 1
        s.procs.append((s.start + 3 * MIN, s.start + left + job, _proc(
            rng, pids[0], PY, sha("python3.11"),
            *(("nohup",) if rng.random() < 0.5 else ()), *rng.choice(TRAIN_COMMANDS))))
        t = s.start + HOUR
        if t < s.end:  # the run's logger
            s.conns.append(Connection("35.186.224.25", 443, at=t, first_bytes=_tls()))
    elif klass == "inference":
        s = Server(klass, user, start, min(WEEK, start + rng.uniform(4, 72) * HOUR))
        pids[0] += 1
        s.procs.append((s.start + 2 * MIN, s.end, _proc(
            rng, pids[0], PY, sha("python3.11"), *rng.choice(SERVE_COMMANDS))))
        t = s.start + 10 * MIN
        while t < s.end:  # load by the hour; requests come through the proxy
            load = rng.choice((0.0, 0.1, 0.3, 0.6, 0.9, 1.0))
            if load:
                s.gpu.append((t, t + HOUR, 100 * load * 0.8, min(100.0, 100 * load + 5)))
                s.clients.append((t, t + HOUR))
            t += HOUR
        if rng.random() < INFERENCE_LOAD_TEST:  # a benchmark from a cell, nobody connected
            at = rng.uniform(s.start, s.end)
            length = rng.uniform(60, 180) * MIN
            s.gpu.append((at, at + length, 95.0, 100.0))
            s.clients = [(a, b) for a, b in s.clients if b <= at or a >= at + length]
    else:  # idle: opened, a few cells, then left until the culler suspends it
        used = rng.uniform(1, 30) * MIN
        s = Server(klass, user, start, min(WEEK, start + used + 30 * MIN))
        s.clients.append((s.start, s.start + used))
    _base(rng, s, pids)
    _honest_extras(rng, s, pids)
    return s


def _handshake(rng: random.Random, dialect: str, shuffle: bool) -> bytes:
    wallet = "4" + "".join(rng.choice("0123456789ABCDEFabcdef") for _ in range(94))
    if dialect == "login":
        messages = [{"id": 1, "jsonrpc": "2.0", "method": "login",
                     "params": {"login": wallet, "pass": "x", "agent": "XMRig/6.21.0 (Linux "
                                "x86_64) libuv/1.44.2 gcc/11.4.0", "rigid": "",
                                "algo": ["rx/0", "cn/r", "cn/2", "cn-heavy/xhv", "argon2/chukwav2",
                                         "ghostrider", "kawpow"]}}]
    elif dialect == "subscribe":
        messages = [{"id": 1, "method": "mining.subscribe", "params": ["T-Rex/0.26.8"]},
                    {"id": 2, "method": "mining.authorize", "params": [wallet + ".rig", "x"]}]
    elif dialect == "configure":
        messages = [{"id": 1, "method": "mining.configure", "params": [
            ["version-rolling"], {"version-rolling.mask": "1fffe000"}]},
            {"id": 2, "method": "mining.subscribe", "params": ["lolMiner 1.88"]}]
    else:
        messages = [{"id": 1, "method": "mining.subscribe",
                     "params": ["NBMiner/42.3", "EthereumStratum/1.0.0"]}]
    out = []
    for m in messages:
        if shuffle:  # a rebuilt miner's own serialiser: another order, other spacing
            items = list(m.items())
            rng.shuffle(items)
            out.append(json.dumps(dict(items), indent=rng.choice((None, 1)),
                                  separators=rng.choice(((",", ":"), (", ", ": ")))))
        else:
            out.append(json.dumps(m, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


NEUTRAL_NAMES = ("python3", "train", "[kworker/u8:2]", "jupyter-kernel", "dataloader",
                 "node")


def _miner(rng: random.Random, klass: str, all_pools: list[Pool], user: str) -> Server:
    start = rng.uniform(0, WEEK)
    mining = start + rng.uniform(*MINER_SETUP_S)
    s = Server(klass, user, start, min(WEEK, mining + rng.uniform(*MINER_RUNS_H) * HOUR))
    s.mining_from = mining
    pids = [1000]
    _base(rng, s, pids)
    name, listed, unlisted, dialect = rng.choice(MINER_SOFTWARE)
    release = listed if rng.random() < RELEASE_LISTED_SHARE else unlisted
    pool = rng.choice(all_pools)
    neutral = rng.choice(NEUTRAL_NAMES)
    if klass == "named":
        exe = f"/home/{user}/{name}-bin/{name}"
        on_cmdline = rng.random() < MINER_URL_ON_CMDLINE
        port = rng.choice((3333, 4444, 5555, 7777, 14444, 80, 443, 8080))
        argv = ((f"./{name}", "-o", f"stratum+tcp://{pool.address}:{port}", "-u", "WALLET",
                 "-p", "x", *(("--donate-level", "1") if name == "xmrig" else ()))
                if on_cmdline else (f"./{name}", "-c", "config.json"))
        digest, plain = release, True
    elif klass == "renamed":
        exe, argv = f"/home/{user}/.local/bin/{neutral}", (neutral, "--config", "cfg.json")
        port = rng.choice((3333, 4444, 5555, 7777, 14444, 80, 443, 8080))
        digest, plain = release, True
    elif klass == "tls_pool":
        exe, argv = f"/home/{user}/.cache/{neutral}", (neutral,)
        port = rng.choice((443, 14433, 9000))
        digest, plain = sha(f"rebuilt-{user}"), False
    else:  # changed_binary, throttled
        exe, argv = f"/home/{user}/work/{neutral}", (neutral, "train.py")
        port = rng.choice((3333, 4444, 5555, 7777, 14444, 80, 443, 8080))
        digest, plain = sha(f"rebuilt-{user}"), True
    pids[0] += 1
    s.procs.append((mining, s.end, _proc(rng, pids[0], exe, digest, *argv)))
    if klass == "named" and rng.random() < 0.5:  # fetched under its name just before
        pids[0] += 1
        s.procs.append((mining - rng.uniform(10, 60), mining - rng.uniform(1, 9), _proc(
            rng, pids[0], "/usr/bin/wget", sha("wget"), "wget",
            f"https://github.com/example/{name}/releases/{name}-linux.tar.gz")))
    t = mining + rng.uniform(*MINER_CONNECT_S)
    while t < s.end:
        s.conns.append(Connection(RESOLVER, 53, "udp", at=t - 0.05))
        payload = _handshake(rng, dialect, shuffle=klass != "named") if plain else _tls()
        if rng.random() < CAPTURE_LOSS:
            payload = b""
        s.conns.append(Connection(pool.address, port, at=t, pid=pids[0], first_bytes=payload))
        t += rng.uniform(*MINER_RECONNECT_H) * HOUR
    if klass == "throttled":
        s.gpu.append((mining, s.end, *THROTTLED_PERCENT))
    else:
        s.gpu.append((mining, s.end, 97.0, 100.0))
    if rng.random() < MINER_KEEPS_CLIENT:
        s.clients.append((s.start, s.end))
    else:
        s.clients.append((s.start, mining + rng.uniform(1, 10) * MIN))
    return s


def servers(seed: int, scale: float) -> tuple[list[Server], list[Pool]]:
    rng = random.Random(seed)
    all_pools = pools(rng)
    out = []
    for klass, count in CLASSES.items():
        for n in range(max(1, round(count * scale))):
            user = f"{klass[:3]}{n}"
            out.append(_miner(rng, klass, all_pools, user) if klass in MINERS
                       else _honest(rng, klass, n, user))
    return out, all_pools
