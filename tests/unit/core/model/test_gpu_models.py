"""The GPU model table and the name mappings every inventory adapter uses."""

import pytest

from gpulease.core.model.gpu_models import (
    GPU_MEMORY,
    KNOWN_MODELS,
    MIG_PROFILES,
    mig_compute_slices,
    mig_memory_bytes,
    mig_profile_from_attributes,
    model_key_from_gfd_product,
    model_key_from_nvml_name,
    valid_mig_profiles,
)

GiB = 1024**3


def test_mig_table_is_the_design_table():
    assert MIG_PROFILES["H200"] == {
        "1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3,
        "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1,
    }
    assert MIG_PROFILES["A100-40GB"] == {
        "1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3,
        "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1,
    }
    eighty = {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3,
              "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
    assert MIG_PROFILES["A100-80GB"] == eighty
    assert MIG_PROFILES["H100-80GB"] == eighty
    assert MIG_PROFILES["H100-NVL"] == {
        "1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3,
        "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1,
    }
    # The two 80 GB tables are separate objects: editing one must not edit both.
    assert MIG_PROFILES["A100-80GB"] is not MIG_PROFILES["H100-80GB"]


def test_every_mig_model_is_known_and_its_largest_profile_is_the_whole_gpu():
    for model, profiles in MIG_PROFILES.items():
        assert model in KNOWN_MODELS
        whole = [p for p in profiles if mig_compute_slices(p) == 7]
        assert len(whole) == 1 and profiles[whole[0]] == 1
        # max instances × slices never exceeds the seven slices of a GPU
        for profile, most in profiles.items():
            assert most * mig_compute_slices(profile) <= 7, profile


def test_slices_and_memory_from_profile_names():
    assert mig_compute_slices("1g.18gb") == 1
    assert mig_compute_slices("1g.18gb+me") == 1
    assert mig_compute_slices("3g.71gb") == 3
    assert mig_compute_slices("7g.141gb") == 7
    assert mig_memory_bytes("1g.18gb") == 18 * GiB
    assert mig_memory_bytes("2g.35gb") == 35 * GiB
    with pytest.raises(ValueError, match="not a MIG profile"):
        mig_compute_slices("big")


def test_known_models_have_nominal_memory():
    assert GPU_MEMORY["H200"] == 141 * GiB
    assert GPU_MEMORY["A100-40GB"] == 40 * GiB
    assert set(KNOWN_MODELS) >= {"A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL", "H200",
                                 "L40S", "A10G", "T4"}


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB"),
    ("NVIDIA H100 PCIe", "H100-80GB"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("NVIDIA H200 MIG 1g.18gb", "H200"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
])
def test_model_key_from_nvml_name(name, key):
    assert model_key_from_nvml_name(name) == key


@pytest.mark.parametrize("label, expected", [
    ("NVIDIA-H200", ("H200", None)),
    ("NVIDIA-H200-MIG-1g.18gb", ("H200", "1g.18gb")),
    ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", ("A100-80GB", "3g.40gb")),
    ("NVIDIA-H100-80GB-HBM3", ("H100-80GB", None)),
    ("NVIDIA-H100-NVL", ("H100-NVL", None)),
    ("Tesla-T4", ("T4", None)),
    ("NVIDIA-A100-SXM4-40GB-SHARED", ("A100-40GB", None)),
    ("NVIDIA-GeForce-RTX-4090", ("NVIDIA-GeForce-RTX-4090", None)),
])
def test_model_key_from_gfd_product(label, expected):
    assert model_key_from_gfd_product(label) == expected


def test_valid_mig_profiles():
    assert valid_mig_profiles("H200") == list(MIG_PROFILES["H200"])
    assert valid_mig_profiles("L40S") is None
    assert valid_mig_profiles("no-such-gpu") is None


def test_profile_from_attributes_picks_the_nearest_memory():
    # An H200 1g.18gb reports about 16 GiB, a 1g.35gb about 32 GiB.
    assert mig_profile_from_attributes("H200", 1, 16_128) == "1g.18gb"
    assert mig_profile_from_attributes("H200", 1, 32_512) == "1g.35gb"
    assert mig_profile_from_attributes("A100-40GB", 3, 19_968) == "3g.20gb"
    assert mig_profile_from_attributes("L40S", 1, 16_000) is None
