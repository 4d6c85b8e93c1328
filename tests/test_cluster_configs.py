"""The shipped cluster examples: Ray's own launcher schema accepts the AWS one, both give the runtime
the two roles it reads (an on-demand head offering ``on_demand``, spot workers offering ``spot``), and
both turn Ray's token authentication on, with the token kept out of the checkout."""

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


def test_the_aws_launcher_config_turns_token_authentication_on_for_every_node() -> None:
    config = yaml.safe_load((CONFIGS / "ray-cluster-spotlight.yaml").read_text())
    # every launcher command sources ~/.bashrc (ray start on head and workers, the job, `ray attach`)
    assert "echo 'export RAY_AUTH_MODE=token' >> ~/.bashrc" in " ".join(config["setup_commands"])
    token = config["file_mounts"]["/home/ubuntu/.ray/auth_token"]  # Ray's default token path on each node
    assert token.startswith("~/.ray/")  # from the user's home (the launcher expands ~), never the checkout
    assert "chmod 600 ~/.ray/auth_token" in config["setup_commands"][0]  # readable by its user alone, first thing
    assert "disabled" not in (CONFIGS / "ray-cluster-spotlight.yaml").read_text()


def start_resources(group: dict) -> dict:
    """KubeRay passes ``rayStartParams.resources`` to ``ray start --resources`` as a quoted JSON string."""
    return json.loads(json.loads(group["rayStartParams"]["resources"]))


def test_the_kuberay_cluster_has_an_on_demand_head_and_spot_worker_groups() -> None:
    cluster = yaml.safe_load((CONFIGS / "kuberay-raycluster.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    # KubeRay makes the token's Secret and gives every Ray container RAY_AUTH_MODE and RAY_AUTH_TOKEN
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    assert tuple(int(part) for part in cluster["spec"]["rayVersion"].split(".")[:2]) >= (2, 52)
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
