"""Static checks of the images (no container engine runs on the build machines).

`problems()` reads every Dockerfile of the build plan (images/build.py) with the
plan's build arguments, follows each notebook image's FROM chain through the
plan, and says what is wrong, each problem naming the image and the rule:

- every FROM names a tag, never `latest`; a FROM in gpulease's registry is an
  image of the plan built before it (the chain resolves inside the catalog);
- the final USER of every image (inherited through the chain) is not root;
- the notebook images install gpulease (its wheel, then `gpulease.singleuser.install`)
  and pin jupyterhub to the hub image's version;
- each catalog entry's labels (inherited) agree with the catalog: the CUDA
  version, the minimum driver and the frameworks with their versions.

    python images/check.py   # prints the problems; exits 1 if there are any
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass

import yaml
from dockerfile_parse import DockerfileParser

from gpulease.images.build import HERE, HUB_IMAGE, PLAN, REGISTRY, Build, ordered, references

ROOT_USERS = {"", "0", "root", "0:0", "root:root"}
PIN = re.compile(r"\bjupyterhub==([0-9][^\s\"']*)")


@dataclass(frozen=True)
class Parsed:
    build: Build
    parents: tuple[str, ...]  # every stage's FROM, the final stage's last
    labels: dict[str, str]
    user: str | None  # the final stage's last USER (None: inherited)
    runs: str  # the final stage's RUN lines, joined


def parse(build: Build, text: str | None = None) -> Parsed:
    if text is None:
        text = (HERE / build.dockerfile).read_text(encoding="utf-8")
    # From a file object: given no path, the parser reads and writes ./Dockerfile.
    dfp = DockerfileParser(fileobj=io.BytesIO(text.encode()), build_args=build.args,
                           env_replace=True)
    final: list[dict] = []
    for item in dfp.structure:
        if item["instruction"] == "FROM":
            final = []
        final.append(item)
    users = [i["value"].strip() for i in final if i["instruction"] == "USER"]
    runs = "\n".join(i["value"] for i in final if i["instruction"] == "RUN")
    return Parsed(build, tuple(dfp.parent_images), dict(dfp.labels),
                  users[-1] if users else None, runs)


def _tag(reference: str) -> str | None:
    name = reference.split("@")[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else None


def problems(plan: tuple[Build, ...] = PLAN, texts: dict[str, str] | None = None,
             catalog: list[dict] | None = None) -> list[str]:
    """What is wrong with the plan's images (texts: Dockerfile contents by name, for tests)."""
    tags = references() if catalog is None else {
        b.name: next((e["image"] for e in catalog if e["name"] == b.name), HUB_IMAGE)
        for b in plan}
    if catalog is None:
        catalog = yaml.safe_load((HERE / "catalog.yaml").read_text())["images"]
    entries = {e["name"]: e for e in catalog}
    found: list[str] = []
    parsed: dict[str, Parsed] = {}
    built: dict[str, str] = {}  # tag -> name, in build order
    for build in ordered(plan, tags):
        p = parsed[build.name] = parse(build, (texts or {}).get(build.name))
        for parent in p.parents:
            tag = _tag(parent)
            if tag is None or tag == "latest" or "$" in parent:
                found.append(f"{build.name}: FROM {parent} must name a fixed tag (not latest)")
            if parent.startswith(REGISTRY + "/") and parent not in built:
                found.append(f"{build.name}: FROM {parent} is no image built before it "
                             f"(built: {', '.join(built.values()) or 'none'})")
        built[tags[build.name]] = build.name
    chain = {name: _chain(name, parsed, tags) for name in parsed}
    hub_pin = PIN.search(parsed["hub"].runs) if "hub" in parsed else None
    for name, stages in chain.items():
        user = next((p.user for p in stages if p.user is not None), None)
        if user is None or user in ROOT_USERS:
            found.append(f"{name}: the final USER is {user or 'root (none set)'}; "
                         "images run as a non-root user")
        if name == "hub":
            continue
        runs = "\n".join(p.runs for p in stages)
        if "gpulease-" not in runs or "gpulease.singleuser.install" not in runs:
            found.append(f"{name}: gpulease.singleuser is not installed "
                         "(the gpulease wheel, then python -m gpulease.singleuser.install)")
        pin = PIN.search(runs)
        if hub_pin is None or pin is None or pin.group(1) != hub_pin.group(1):
            found.append(f"{name}: jupyterhub=={pin.group(1) if pin else '(unpinned)'} is not "
                         f"the hub image's {hub_pin.group(1) if hub_pin else '(unpinned)'}")
        labels: dict[str, str] = {}
        for p in reversed(stages):  # the base's labels, then each image's over them
            labels.update(p.labels)
        found += _label_problems(name, labels, entries.get(name))
    for name in entries:
        if name not in parsed:
            found.append(f"{name}: in the catalog but not built by images/build.py")
    return found


def _chain(name: str, parsed: dict[str, Parsed], tags: dict[str, str]) -> list[Parsed]:
    """The image, then its base, … while the base is an image of the plan."""
    by_tag = {tags[n]: n for n in parsed}
    out = [parsed[name]]
    while (base := by_tag.get(out[-1].parents[-1] if out[-1].parents else "")) is not None:
        out.append(parsed[base])
    return out


def _label_problems(name: str, labels: dict[str, str], entry: dict | None) -> list[str]:
    if entry is None:
        return []
    out = []
    cuda, label = str(entry.get("cuda") or ""), labels.get("org.gpulease.cuda.version", "")
    if not (label == cuda or label.startswith(cuda + ".")):
        out.append(f"{name}: label org.gpulease.cuda.version={label or '(none)'} is not the "
                   f"catalog's cuda {cuda or '(none)'}")
    driver = str(entry.get("min_driver") or "")
    if labels.get("org.gpulease.driver.min", "") != driver:
        out.append(f"{name}: label org.gpulease.driver.min="
                   f"{labels.get('org.gpulease.driver.min') or '(none)'} is not the catalog's "
                   f"min_driver {driver or '(none)'}")
    said = labels.get("org.gpulease.frameworks", "")
    frameworks = dict(pair.split("=", 1) for pair in said.split(",") if "=" in pair)
    wanted = {str(k): str(v) for k, v in (entry.get("frameworks") or {}).items()}
    if frameworks != wanted:
        out.append(f"{name}: label org.gpulease.frameworks={said or '(none)'} is not the "
                   f"catalog's frameworks {wanted or '{}'}")
    return out


if __name__ == "__main__":
    listed = problems()
    print("\n".join(listed) or "images: every check holds")
    sys.exit(1 if listed else 0)
