"""What the misuse rules' tests share: a deny list like an admin's, honest processes."""

from __future__ import annotations

import hashlib

from gpulease.core.policy.misuse.processes import ProcessDenyList, ProcessEntry, ProcessRecord


def sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


XMRIG_SHA = sha("xmrig-6.21.0-linux-static-x64")
DENY = ProcessDenyList((
    ProcessEntry("xmrig-6.21.0", sha256=XMRIG_SHA.upper(), description="XMRig 6.21.0 release"),
    ProcessEntry("stratum-url", pattern=r"stratum\d?\+(?:tcp|ssl|tls)://",
                 description="a pool URL on the command line"),
    ProcessEntry("miner-names", pattern=r"(?:^|[\s/])(?:xmrig|t-rex|lolminer|nbminer|gminer|"
                 r"teamredminer|nanominer|phoenixminer|ethminer|srbminer-multi)(?:\s|$)",
                 description="well-known miners by name"),
    ProcessEntry("donate-level", pattern=r"--donate-level\b", description="xmrig's option"),
    ProcessEntry("miner-exe", pattern=r"/(?:xmrig|t-rex)$", target="exe",
                 description="a miner's executable name"),
))

# What honest servers run: none of it may match DENY.
HONEST = [
    ProcessRecord(101, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("/usr/local/bin/python3.11", "/usr/local/bin/jupyterhub-singleuser",
                   "--ip=0.0.0.0", "--port=8888")),
    ProcessRecord(102, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("python", "-m", "ipykernel_launcher", "-f",
                   "/home/ada/.local/share/jupyter/runtime/kernel-4f2a.json")),
    ProcessRecord(103, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("torchrun", "--nproc_per_node=8", "train.py", "--config",
                   "configs/llama-3.2-1b.yaml")),
    ProcessRecord(104, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("python", "train_metric.py", "--miner", "MultiSimilarityMiner",
                   "--loss", "triplet")),  # pytorch-metric-learning's hard-negative miners
    ProcessRecord(105, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("python", "-m", "minerl.env", "--seed", "3")),  # MineRL: Minecraft RL
    ProcessRecord(106, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("python", "data_miner.py", "--source", "s3://corpus/text")),
    ProcessRecord(107, "/usr/local/bin/python3.11", sha("python3.11"),
                  ("vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000")),
    ProcessRecord(108, "/usr/bin/nvidia-smi", sha("nvidia-smi"),
                  ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv")),
    ProcessRecord(109, "/usr/bin/bash", sha("bash"),
                  ("bash", "-c", "nohup python train.py > train.log 2>&1 &")),
    ProcessRecord(110, None, None, ("python", "eval.py")),  # exe unreadable: no hash
    ProcessRecord(111, "/usr/bin/grep", sha("grep"),
                  ("grep", "-rn", "stratum", "notes/")),  # reading about it is not mining
]
