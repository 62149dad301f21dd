"""`GET api/recommend` (issue 48) over HTTP, in-process: the service's real app on a SQLite
database and the demo inventory (seven H200 1g.18gb slices and a whole H200), beside a FAKE
hub that says whose each token is.

A researcher describing a Llama 3.1 8B LoRA gets the estimate with every part and how it
was computed, the profiles it fits cheapest first with their price and what is free, and
one to start; a profile of a group they are not in is never listed; every wrong field is a
400 naming it and what is allowed, never a 500.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpulease.core.model.llm_shapes import MODELS
from gpulease.core.model.profiles import SAMPLE_PROFILES, parse_profile
from gpulease.core.policy.memory_estimate import Workload, estimate
from tests.support.service_app import ACCESS, ctx_of, running_service

DEMO_INVENTORY = SAMPLE_PROFILES.parent / "demo-inventory.yaml"
TOKENS = {
    "ada": {"kind": "user", "name": "ada", "admin": False, "groups": [],
            "scopes": ["access:servers!user=ada", ACCESS]},
    "lab": {"kind": "user", "name": "lin", "admin": False, "groups": ["nlp"],
            "scopes": ["access:servers!user=lin", ACCESS]},
}


def profile(slug: str, gpu: dict | None, price: str, groups=(), enabled=True) -> dict:
    spec = {"slug": slug, "display_name": slug.upper(), "cpu": 4, "memory": "32Gi",
            "images": ["pytorch"], "price_per_hour": price, "min_run": "10m",
            "idle_timeout": "30m", "max_runtime": 0, "groups": list(groups),
            "enabled": enabled}
    if gpu is not None:
        spec["gpu"] = gpu
    return spec


@pytest.fixture
async def service(tmp_path, monkeypatch):
    async with running_service(tmp_path, monkeypatch, TOKENS,
                               GPULEASE_INVENTORY_FILE=str(DEMO_INVENTORY)) as (base, app):
        ctx = ctx_of(app)
        for p in (profile("cpu", None, "0.10"),
                  profile("h200-1g", {"model": "H200", "mig": "1g.18gb"}, "1.20"),
                  profile("h200-full", {"model": "H200", "count": 1}, "8.00"),
                  # cheaper than a whole card, but only for the nlp group
                  profile("nlp-full", {"model": "H200", "count": 1}, "5.00", groups=["nlp"]),
                  profile("old-full", {"model": "H200", "count": 1}, "0.50", enabled=False)):
            ctx.profiles.upsert(parse_profile(p, ctx.catalog, slug=p["slug"]))
        yield base


async def recommend(base: str, token: str = "ada", **query):
    r = await AsyncHTTPClient().fetch(f"{base}api/recommend?{urlencode(query)}",
                                      raise_error=False,
                                      headers={"Authorization": f"token {token}"})
    return r.code, json.loads(r.body)


async def test_a_lora_fine_tune_gets_its_estimate_and_the_profiles_it_fits(service):
    code, body = await recommend(service, model="meta-llama/Llama-3.1-8B", task="lora",
                                 batch=1, sequence=512)
    assert code == 200, body
    assert body["workload"]["model"]["parameters"] == 8_030_261_248
    assert body["workload"]["model"]["source"].endswith("Llama-3.1-8B/blob/main/config.json")
    want = estimate(Workload(shape=MODELS["llama-3.1-8b"], task="lora", precision="bf16",
                             batch=1, sequence=512))
    assert body["estimate"]["bytes"] == want.total
    parts = {p["name"]: p for p in body["estimate"]["parts"]}
    assert set(parts) == {"weights", "gradients", "optimizer", "activations", "logits",
                          "cuda_context"}
    assert all(p["how"] for p in parts.values())
    assert parts["weights"]["bytes"] == 8_030_261_248 * 2
    assert body["headroom"] == 1.25 and body["needed_bytes"] == int(want.total * 1.25 + 0.5)
    # 16 GB of bf16 weights and more: no 1g.18gb slice; a whole H200, free now
    assert [p["slug"] for p in body["profiles"]] == ["h200-full"]
    (full,) = body["profiles"]
    assert full["price_per_hour"] == "8.000000"
    assert full["availability"] == {"free": 1, "total": 1, "queued": 0, "state": "free"}
    assert [p["slug"] for p in body["too_small"]] == ["h200-1g"]
    assert body["too_small"][0]["availability"]["free"] == 7
    assert body["recommended"] == "h200-full"
    assert "cheapest profile that fits" in body["reason"]


async def test_the_answer_names_what_it_estimated(service):
    _, known = await recommend(service, model="llama-3.2-1b", task="inference")
    assert known["estimated_for"] == "Llama 3.2 1B, 1.24 B parameters"
    _, bare = await recommend(service, parameters="70B", task="inference")
    assert bare["estimated_for"] == "a 70 B-parameter model (a Llama-like shape assumed)"
    assert bare["workload"]["model"]["parameters"] == 70 * 10**9


async def test_small_work_fits_a_slice_and_the_slice_comes_first(service):
    code, body = await recommend(service, model="llama-3.2-1b", task="inference",
                                 precision="bf16", sequence=4096, batch=4)
    assert code == 200, body
    assert [p["slug"] for p in body["profiles"]] == ["h200-1g", "h200-full"]
    assert body["profiles"][0]["price_per_hour"] == "1.200000"
    assert body["recommended"] == "h200-1g"
    assert {p["name"] for p in body["estimate"]["parts"]} == {"weights", "kv_cache", "prefill",
                                                              "cuda_context"}


async def test_only_profiles_the_caller_may_use_are_listed(service):
    _, ada = await recommend(service, parameters="7B", task="qlora")
    listed = {p["slug"] for p in ada["profiles"] + ada["too_small"]}
    assert "nlp-full" not in listed and "old-full" not in listed and "cpu" not in listed
    assert ada["workload"]["model"]["assumed"] is True
    _, lin = await recommend(service, token="lab", model="llama-3.2-3b", task="full",
                             sequence=1024, checkpointing="true")
    slugs = [p["slug"] for p in lin["profiles"]]
    # the nlp group's cheaper whole card first, for a member of the group only
    assert slugs[:2] == ["nlp-full", "h200-full"]
    assert lin["recommended"] == "nlp-full"


async def test_work_no_profile_holds_says_what_to_try(service):
    code, body = await recommend(service, model="llama-3.1-70b", task="full")
    assert code == 200
    assert body["profiles"] == [] and body["recommended"] is None
    assert "int4" in body["reason"]


@pytest.mark.parametrize(("query", "field"), [
    ({"task": "lora"}, "model"),
    ({"model": "gpt-17", "task": "lora"}, "model"),
    ({"model": "llama-2-7b"}, "task"),
    ({"model": "llama-2-7b", "task": "pretrain"}, "task"),
    ({"model": "llama-2-7b", "task": "lora", "precision": "fp8"}, "precision"),
    ({"model": "llama-2-7b", "task": "full", "precision": "int4"}, "precision"),
    ({"model": "llama-2-7b", "task": "qlora", "precision": "bf16"}, "precision"),
    ({"model": "llama-2-7b", "task": "lora", "batch": "0"}, "batch"),
    ({"model": "llama-2-7b", "task": "lora", "sequence": "lots"}, "sequence"),
    ({"model": "llama-2-7b", "task": "lora", "sequence": "99999999999"}, "sequence"),
    ({"model": "llama-2-7b", "task": "lora", "checkpointing": "maybe"}, "checkpointing"),
    ({"model": "llama-2-7b", "task": "inference", "checkpointing": "true"}, "checkpointing"),
    ({"model": "llama-2-7b", "task": "full", "optimizer": "sgd"}, "optimizer"),
    ({"model": "llama-2-7b", "task": "full", "lora_rank": "8"}, "lora_rank"),
    ({"parameters": "a lot", "task": "lora"}, "parameters"),
    ({"parameters": "1e30", "task": "lora"}, "parameters"),
    ({"model": "llama-2-7b", "parameters": "7B", "task": "lora"}, "parameters"),
    ({"model": "llama-2-7b", "task": "lora", "gpus": "2"}, "gpus"),
])
async def test_a_wrong_description_is_400_naming_the_field(service, query, field):
    code, body = await recommend(service, **query)
    assert code == 400, body
    assert body["status"] == 400
    assert field in [e["field"] for e in body["errors"]], body
    assert all(e["message"] for e in body["errors"])


async def test_a_stranger_is_refused(service):
    code, body = await recommend(service, token="nobody", model="llama-2-7b", task="lora")
    assert code == 403 and body["status"] == 403
