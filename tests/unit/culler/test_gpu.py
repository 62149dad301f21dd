"""A pod's devices from dcgm-exporter's series (idle-culler/gpu.py `dcgm_pods`), as pure
functions over Prometheus answers: under DRA the exporter maps a MIG device to its parent
GPU and labels that GPU's series with every pod holding a slice of it, so a pod is read on
its own slice's instance only, and unknown (with why) where that cannot be told."""

from __future__ import annotations

from gpulease.idle_culler.gpu import DCGM_METRIC, PodDevice, dcgm_index, dcgm_pods

NS = "jhub"
SAME = ("dcgm-exporter labels 2 1g.18gb instances of GPU-m with this pod (DRA maps MIG "
        "devices to their GPU): no way to tell which is its own")


def answer(*series: list[dict]) -> dict:
    return {"status": "success",
            "data": {"resultType": "vector", "result": [s for group in series for s in group]}}


def sample(labels: dict, ratio: float) -> dict:
    return {"metric": {"__name__": DCGM_METRIC, "gpu": "0", "device": "nvidia0",
                       "Hostname": "gpu-node-1", **labels},
            "value": [1741000000.0, repr(ratio)]}


def dra_mig_gpu(uuid: str, instances: dict[str, tuple[str, float]],
                holders: list[tuple[str, str, str, str]]) -> list[dict]:
    """One MIG GPU as dcgm-exporter with KUBERNETES_ENABLE_DRA labels it: every series of the
    GPU (`instances`: GPU_I_ID -> (GPU_I_PROFILE, ratio); '' the whole GPU's) copied once for
    each pod holding a slice of it, with that pod's claim (`holders`: pod, its slice's
    profile, the driver's device name, its MIG uuid: '' with DynamicMIG)."""
    out = []
    for gi, (profile, ratio) in instances.items():
        for pod, slice_profile, device, mig_uuid in holders:
            labels = {"UUID": uuid, "namespace": NS, "pod": pod, "container": "notebook",
                      "dra_claim_name": f"{pod}-gpus-x1", "dra_claim_namespace": NS,
                      "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": "gpu-node-1",
                      "dra_device_name": device, "dra_mig_profile": slice_profile,
                      "dra_mig_device_uuid": mig_uuid}
            if gi:
                labels |= {"GPU_I_ID": gi, "GPU_I_PROFILE": profile}
            out.append(sample(labels, ratio))
    return out


def test_each_pod_reads_only_its_own_slice_of_a_shared_gpu():
    """A busy 3g and an idle 1g of one GPU: the exporter labels both instances with both
    pods; each pod's device is its own profile's instance, so the idle one reads idle."""
    body = answer(dra_mig_gpu(
        "GPU-m", {"1": ("3g.71gb", 0.9), "9": ("1g.18gb", 0.0)},
        [("jupyter-ada", "3g.71gb", "gpu-0-mig-3g71gb-9-0", "MIG-ada"),
         ("jupyter-bob", "1g.18gb", "gpu-0-mig-1g18gb-19-4", "MIG-bob")]))
    assert dcgm_pods(body) == {(NS, "jupyter-ada"): [PodDevice("GPU-m/gi1")],
                               (NS, "jupyter-bob"): [PodDevice("GPU-m/gi9")]}
    index = dcgm_index(body)
    assert index[("GPU-m", "1")] == 90.0 and index[("GPU-m", "9")] == 0.0


def test_two_slices_of_one_profile_on_a_gpu_are_unknown_never_the_busiest():
    """Two 1g slices of one GPU, one busy: nothing in the exporter's series tells whose
    is whose, so neither pod has a reading of it (with why), never the max, never 0;
    the same with DynamicMIG, whose devices have no MIG uuid."""
    for ada_uuid, bob_uuid in (("MIG-ada", "MIG-bob"), ("", "")):
        body = answer(dra_mig_gpu(
            "GPU-m", {"9": ("1g.18gb", 0.95), "10": ("1g.18gb", 0.0)},
            [("jupyter-ada", "1g.18gb", "gpu-0-mig-1g18gb-19-4", ada_uuid),
             ("jupyter-bob", "1g.18gb", "gpu-0-mig-1g18gb-19-5", bob_uuid)]))
        assert dcgm_pods(body) == {
            (NS, "jupyter-ada"): [PodDevice("GPU-m/gpu-0-mig-1g18gb-19-4", SAME)],
            (NS, "jupyter-bob"): [PodDevice("GPU-m/gpu-0-mig-1g18gb-19-5", SAME)]}


def test_a_slice_labelled_only_on_its_gpus_other_series_is_unknown():
    """The whole GPU's series (no GPU_I_ID) carries every slice's pod too: it is no pod's
    own reading; where it is all the pod is labelled on, the pod's slice is unknown."""
    holders = [("jupyter-ada", "1g.18gb", "gpu-0-mig-1g18gb-19-4", "MIG-ada")]
    body = answer(dra_mig_gpu("GPU-m", {"": ("", 0.6), "1": ("3g.71gb", 0.9)}, holders))
    assert dcgm_pods(body) == {(NS, "jupyter-ada"): [PodDevice(
        "GPU-m/gpu-0-mig-1g18gb-19-4",
        "dcgm-exporter labels no 1g.18gb instance of GPU-m with this pod, only other "
        "series of that GPU (DRA maps MIG devices to their GPU)")]}
    body = answer(dra_mig_gpu("GPU-m", {"": ("", 0.6), "9": ("1g.18gb", 0.0)}, holders))
    assert dcgm_pods(body) == {(NS, "jupyter-ada"): [PodDevice("GPU-m/gi9")]}


def test_full_cards_under_dra_and_device_plugin_slices_are_as_labelled():
    """Beside a DRA-shared MIG GPU: a full card of a DRA claim (no dra_mig_profile) and a
    device-plugin slice (the exporter maps it to its instance exactly; two of one GPU are
    both the pod's) are the pod's as labelled, each container's copy once."""
    card = {"UUID": "GPU-f", "namespace": NS, "pod": "jupyter-cy", "dra_device_name": "gpu-1",
            "dra_claim_name": "jupyter-cy-gpus-x1", "dra_pool_name": "gpu-node-1",
            "dra_driver_name": "gpu.nvidia.com"}
    plugin = {"UUID": "GPU-p", "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.18gb",
              "namespace": NS, "pod": "jupyter-dan"}
    body = answer(
        [sample(card | {"container": "notebook"}, 0.5), sample(card | {"container": "x"}, 0.5),
         sample(plugin, 0.0), sample(plugin | {"GPU_I_ID": "4"}, 0.8)],
        dra_mig_gpu("GPU-m", {"9": ("1g.18gb", 0.0), "10": ("2g.35gb", 0.9)},
                    [("jupyter-eve", "1g.18gb", "gpu-0-mig-1g18gb-19-4", "MIG-eve")]))
    assert dcgm_pods(body) == {(NS, "jupyter-cy"): [PodDevice("GPU-f")],
                               (NS, "jupyter-dan"): [PodDevice("GPU-p/gi3"),
                                                     PodDevice("GPU-p/gi4")],
                               (NS, "jupyter-eve"): [PodDevice("GPU-m/gi9")]}
