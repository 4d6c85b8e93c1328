"""The shipped cluster examples: Ray's own launcher schema accepts the AWS one, and both give the runtime
the two roles it reads (an on-demand head offering ``on_demand``, spot workers offering ``spot``)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import ray.autoscaler
import yaml

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_the_aws_launcher_config_passes_rays_schema_with_an_on_demand_head_and_spot_workers() -> None:
    config = yaml.safe_load((CONFIGS / "ray-cluster-spotlight.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    assert config["provider"]["type"] == "aws"
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"]["on_demand"] >= 1 and head["max_workers"] == 0
    assert "InstanceMarketOptions" not in head["node_config"]  # the trainer is never preempted
    spot = [t for t in types.values() if t["resources"].get("spot", 0) >= 1]
    assert spot and all(t["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot" for t in spot)
    assert all(t["resources"]["spot"] == t["resources"]["GPU"] for t in spot)  # one device per GPU
    assert all(t["node_config"]["MetadataOptions"]["HttpTokens"] == "required" for t in types.values())
    assert any("scripts/setup.sh" in command for command in config["setup_commands"])


def start_resources(group: dict) -> dict:
    """KubeRay passes ``rayStartParams.resources`` to ``ray start --resources`` as a quoted JSON string."""
    return json.loads(json.loads(group["rayStartParams"]["resources"]))


def test_the_kuberay_cluster_has_an_on_demand_head_and_spot_worker_groups() -> None:
    cluster = yaml.safe_load((CONFIGS / "kuberay-raycluster.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert start_resources(head) == {"on_demand": 1}
    assert head["template"]["spec"]["nodeSelector"]["eks.amazonaws.com/capacityType"] == "ON_DEMAND"
    workers = cluster["spec"]["workerGroupSpecs"]
    assert workers
    for group in workers:
        pod = group["template"]["spec"]
        gpus = int(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert start_resources(group) == {"spot": gpus}
        assert pod["nodeSelector"]["eks.amazonaws.com/capacityType"] == "SPOT"
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert pod["terminationGracePeriodSeconds"] >= 120  # the spot notice's two minutes
