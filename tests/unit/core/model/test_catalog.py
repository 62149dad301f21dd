import textwrap

import pytest

from gpulease.core.model.catalog import Catalog, CatalogError, Image, load_catalog, parse_catalog
from gpulease.images import CATALOG_PATH, shipped_catalog


def write(tmp_path, text: str):
    path = tmp_path / "catalog.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_shipped_catalog():
    catalog = shipped_catalog()
    assert catalog == load_catalog(CATALOG_PATH)
    assert catalog.names() == ("pytorch", "cuda", "tensorrt-llm", "cuda-12.8")
    pytorch = catalog.get("pytorch")
    assert pytorch.cuda == "12.6" and pytorch.min_driver == "560.28"
    assert pytorch.frameworks == {"torch": "2.6.0"}
    assert catalog.get("cuda").cuda == "12.6"
    trt = catalog.get("tensorrt-llm")
    assert trt.cuda == "12.8" and trt.min_driver == "570.124"
    for image in catalog.images:
        assert image.image.startswith("registry.example.org/gpulease/")
        assert image.local_env is None
        assert image.description
    assert catalog.get("nope") is None


def test_full_entry_and_unquoted_versions_keep_their_text(tmp_path):
    path = write(tmp_path, """
        images:
          - name: torch
            image: r/x:1
            cuda: 12.10
            min_driver: "560.28"
            frameworks: {torch: 2.6.0, jax: 0.40}
            description: d
            local_env: /opt/envs/torch
          - name: bare
            image: r/bare:1
    """)
    catalog = load_catalog(path)
    assert catalog.get("torch") == Image(
        name="torch", image="r/x:1", cuda="12.10", min_driver="560.28",
        frameworks={"torch": "2.6.0", "jax": "0.40"}, description="d",
        local_env="/opt/envs/torch",
    )
    bare = catalog.get("bare")
    assert (bare.cuda, bare.min_driver, bare.frameworks, bare.description, bare.local_env) == (
        None, None, {}, "", None)
    assert len({bare, catalog.get("torch")}) == 2  # hashable despite the dict field


@pytest.mark.parametrize("body, expected", [
    ("  - {name: a, image: r/a, colour: red}", "unknown keys colour"),
    ("  - {name: a, image: r/a}\n  - {name: a, image: r/b}", "duplicate name 'a'"),
    ("  - {image: r/a}", "name is required"),
    ("  - {name: a}", "image (the container image reference) is required"),
    ("  - {name: A_B!, image: r/a}", "name is required"),
    ("  - {name: a, image: r/a, frameworks: [torch]}", "frameworks maps names to versions"),
    ("  - {name: a, image: r/a, cuda: ''}", "cuda must be a non-empty string"),
    ("  - {name: a, image: r/a, description: [x]}", "description must be a string"),
    ("  - just-a-string", "each image is a mapping"),
])
def test_invalid_entries(tmp_path, body, expected):
    path = write(tmp_path, "images:\n" + body + "\n")
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert any(expected in error for error in info.value.errors), info.value.errors
    assert all(error.startswith(str(path)) for error in info.value.errors)


def test_every_problem_is_reported_at_once():
    data = {"images": [{"name": "a"}, {"image": "r/b"}, {"name": "c", "image": "r/c", "x": 1}],
            "extra": 1}
    with pytest.raises(CatalogError) as info:
        parse_catalog(data, "cat.yaml")
    errors = info.value.errors
    assert len(errors) == 4, errors
    assert "cat.yaml: unknown top-level keys extra; allowed: images" in errors
    assert str(info.value) == "\n".join(errors)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("data", [None, [], {"images": {}}, {"imgs": []}])
def test_top_level_shape(data):
    with pytest.raises(CatalogError, match="list under 'images'"):
        parse_catalog(data)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(write(tmp_path, "images: [\n"))
    with pytest.raises(OSError):
        load_catalog(tmp_path / "absent.yaml")


def test_empty_catalog_is_valid():
    assert parse_catalog({"images": []}) == Catalog(())
