"""deploy/k8s: every manifest validates against the Kubernetes schemas offline, and the pieces
refer to one another correctly (selectors, ports, probes, the autoscaler's metric, drain time)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from python_backend.common.contract import QUEUE_DEPTH_METRIC, SHUTDOWN_DRAIN_S

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.37.0"
# custom resources have no schema in kubernetes-validate: checked by the cross-references below
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def documents() -> list[tuple[str, dict]]:
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    out = []
    for name in listed:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc:
                out.append((name, doc))
    return out


def one(kind: str) -> dict:
    (doc,) = [d for _, d in documents() if d["kind"] == kind]
    return doc


def containers(pod: dict, init: bool = False) -> dict[str, dict]:
    return {c["name"]: c for c in pod["initContainers" if init else "containers"]}


def pod_spec() -> dict:
    return one("Deployment")["spec"]["template"]["spec"]


def pod_labels() -> dict:
    return one("Deployment")["spec"]["template"]["metadata"]["labels"]


def test_the_kustomization_lists_every_manifest_in_the_folder():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def builtin(docs: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    return [(n, d) for n, d in docs if (d["apiVersion"], d["kind"]) not in CUSTOM_KINDS]


@pytest.mark.parametrize(
    "doc",
    [d for _, d in builtin(documents())],
    ids=[f"{n}:{d['kind']}" for n, d in builtin(documents())],
)
def test_every_manifest_validates_against_the_kubernetes_schemas(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_custom_resources_are_only_the_known_ones():
    custom = {(d["apiVersion"], d["kind"]) for _, d in documents()} - {
        (d["apiVersion"], d["kind"]) for _, d in builtin(documents())
    }
    assert custom == CUSTOM_KINDS


def test_an_invalid_manifest_is_caught_by_the_validation():
    broken = yaml.safe_load(yaml.safe_dump(one("Deployment")))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": "http"}]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_selectors_match_the_pod_labels():
    labels = pod_labels()
    deployment = one("Deployment")
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one("Service")["spec"]["selector"].items() <= labels.items()
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    monitor = one("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert monitor.items() <= one("Service")["metadata"]["labels"].items()
    target = one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_service_ports_reach_the_front_door_and_never_triton():
    door = containers(pod_spec())["front-door"]
    named = {p["name"]: p["containerPort"] for p in door["ports"]}
    service_ports = one("Service")["spec"]["ports"]
    assert {p["targetPort"] for p in service_ports} <= set(named)
    endpoint = one("ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in service_ports}
    policy_ports = {
        p["port"] for rule in one("NetworkPolicy")["spec"]["ingress"] for p in rule["ports"]
    }
    assert policy_ports == set(named)
    # Triton listens on the pod's loopback, on ports no container publishes
    triton = containers(pod_spec())["triton"]
    assert "--triton-address=127.0.0.1" in triton["args"]
    assert "ports" not in triton
    triton_ports = {e["name"]: e["value"] for e in triton["env"] if e["name"].endswith("_PORT")}
    door_env = {e["name"]: e.get("value") for e in door["env"]}
    for kind in ("HTTP", "GRPC", "METRICS"):
        assert (
            door_env[f"TRITON_{kind}_ADDRESS"] == f"127.0.0.1:{triton_ports[f'TRITON_{kind}_PORT']}"
        )
    assert set(named.values()).isdisjoint(int(v) for v in triton_ports.values())
    # the OpenAI adapter: on loopback too, talking to Triton's gRPC port, served by the door
    adapter = containers(pod_spec())["openai-api"]["args"]
    assert f"--listen={door_env['OPENAI_ADDRESS']}" in adapter
    assert f"--triton-grpc={door_env['TRITON_GRPC_ADDRESS']}" in adapter
    assert door_env["OPENAI_ADDRESS"].startswith("127.0.0.1:")
    # the body check: on loopback, in front of Triton's ports, the door's body limit
    check = containers(pod_spec())["body-check"]["args"]
    for kind in ("http", "grpc", "stream"):
        assert f"--{kind}-listen={door_env[f'CHECK_{kind.upper()}_ADDRESS']}" in check
        assert door_env[f"CHECK_{kind.upper()}_ADDRESS"].startswith("127.0.0.1:")
    for kind in ("http", "grpc"):
        assert f"--triton-{kind}={door_env[f'TRITON_{kind.upper()}_ADDRESS']}" in check
    assert f"--max-body-size={door_env['MAX_BODY_SIZE']}" in check
    assert door_env["STREAM_BODY_SIZE"] == "0"
    assert door_env["CHECK_STREAM_ADDRESS"] != door_env["TRITON_GRPC_ADDRESS"]
    # its read budget, deadline and stream message: the launcher's defaults
    from tools.front_door import env_defaults
    from tools.serve import ServeSettings

    launcher = env_defaults(ServeSettings)
    assert f"--grpc-bytes-in-progress={launcher['CHECK_GRPC_BYTES_IN_PROGRESS']}" in check
    (deadline,) = [a for a in check if a.startswith("--body-deadline-s=")]
    assert float(deadline.split("=")[1]) == float(launcher["CHECK_BODY_DEADLINE_S"])
    assert f"--stream-message-size={launcher['CHECK_STREAM_MESSAGE_SIZE']}" in check


def test_the_front_door_renders_the_template_every_deployment_renders():
    from tools.front_door import SCRIPT, TEMPLATES, template_names

    door = containers(pod_spec())["front-door"]
    # every name the templates use is set; NVIDIA_VISIBLE_DEVICES is the runtime's, not nginx's
    # (the keys map's script reads API_KEY)
    env = {e["name"]: e.get("value") for e in door["env"]}
    assert template_names() == set(env) - {"NVIDIA_VISIBLE_DEVICES", "API_KEY"}
    mounts = {m["mountPath"]: m for m in door["volumeMounts"]}
    copy = " ".join(containers(pod_spec(), init=True)["front-door-files"]["args"])
    for template in TEMPLATES:
        assert f"/app/{template.relative_to(ROOT)} /front-door/templates/" in copy
    assert mounts["/etc/nginx/templates"]["name"] == "front-door-templates"
    # the main configuration (njs, the stream block) and the header check, from the same copy
    for path, name in (
        (env["FRONT_DOOR_SCRIPT"], SCRIPT.name),
        ("/etc/nginx/nginx.conf", "nginx.conf"),
    ):
        assert f"/app/{(SCRIPT.parent / name).relative_to(ROOT)}" in copy
        assert mounts[path]["subPath"] == name and mounts[path]["name"] == "front-door-main"
    # the user the container runs as may write where the image renders the stream template
    assert mounts["/etc/nginx/stream-conf.d"]["name"] == "front-door-stream-conf"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert door["image"] == compose["services"]["front-door"]["image"]
    api_key = next(e for e in door["env"] if e["name"] == "API_KEY")
    assert api_key["valueFrom"]["secretKeyRef"]["optional"] is True, "no default credentials"


def test_probes_follow_the_served_models_own_ready_route_through_the_door():
    spec = pod_spec()
    triton, door = containers(spec)["triton"], containers(spec)["front-door"]
    model = triton["args"][triton["args"].index("--model=minilm")].split("=", 1)[1]
    build = containers(spec, init=True)["build-engines"]["args"]
    assert f"--name={model}" in build
    for probe in ("startupProbe", "readinessProbe"):
        assert door[probe]["httpGet"] == {"path": f"/v2/models/{model}/ready", "port": "http"}
    assert door["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_the_grace_period_covers_the_drain():
    spec = pod_spec()
    triton, door = containers(spec)["triton"], containers(spec)["front-door"]
    pre_stop = int(triton["lifecycle"]["preStop"]["exec"]["command"][-1])
    exit_timeout = int(next(e["value"] for e in triton["env"] if e["name"] == "EXIT_TIMEOUT_S"))
    needed = pre_stop + exit_timeout + SHUTDOWN_DRAIN_S
    assert spec["terminationGracePeriodSeconds"] >= needed
    # the door outlives Triton's drain, so answers still reach their clients
    assert int(door["lifecycle"]["preStop"]["exec"]["command"][-1]) >= pre_stop + exit_timeout


def test_the_autoscaler_scales_on_a_metric_the_model_exports():
    (metric,) = one("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    rules = yaml.safe_load(one("ConfigMap")["data"]["config.yaml"])["rules"]
    (rule,) = [r for r in rules if r["name"]["as"] == name]
    assert rule["seriesQuery"].startswith(f"{QUEUE_DEPTH_METRIC}{{")
    assert re.fullmatch(rule["name"]["matches"], QUEUE_DEPTH_METRIC)
    # per pod: the instances' queues add up (each carries its own instance label)
    assert rule["metricsQuery"].startswith("sum(")
    metrics_source = (ROOT / "python_backend" / "stub" / "metrics.py").read_text()
    assert "name=QUEUE_DEPTH_METRIC" in metrics_source


def test_gpus_images_and_users():
    spec = pod_spec()
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    release = compose["x-release"]["NGC_RELEASE"]
    for container in [*containers(spec).values(), *containers(spec, init=True).values()]:
        if container["image"].startswith("triton-batch-planner"):
            assert container["image"] == f"triton-batch-planner:{release}"
    for name in ("triton",):
        assert containers(spec)[name]["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert containers(spec, init=True)["build-engines"]["resources"]["limits"]["nvidia.com/gpu"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+)$", dockerfile, re.M)
    assert spec["securityContext"]["runAsUser"] == int(user)
    assert spec["securityContext"]["runAsNonRoot"] is True
    # no claim by default: a cluster with only ReadWriteOnce classes schedules the pod
    assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v]


def test_the_shared_timing_cache_is_an_overlay_that_puts_the_volume_on_its_claim():
    overlay = K8S / "shared-timing-cache"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../", "timing-cache.yaml"]
    (claim,) = yaml.safe_load_all((overlay / "timing-cache.yaml").read_text())
    kubernetes_validate.validate(claim, KUBERNETES_VERSION, strict=True)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    (patch,) = [yaml.safe_load((overlay / p["path"]).read_text()) for p in kustomization["patches"]]
    assert patch["metadata"]["name"] == one("Deployment")["metadata"]["name"]
    (volume,) = patch["spec"]["template"]["spec"]["volumes"]
    base = {v["name"]: v for v in pod_spec()["volumes"]}
    assert "emptyDir" in base[volume["name"]] and volume["emptyDir"] is None  # replaced
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mounted = containers(pod_spec(), init=True)["build-engines"]["volumeMounts"]
    assert volume["name"] in {m["name"] for m in mounted}


def test_the_autoscaler_alone_sets_the_replica_count():
    assert one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert "replicas" not in one("Deployment")["spec"]


def test_the_service_monitor_carries_the_label_kube_prometheus_stack_selects():
    labels = one("ServiceMonitor")["metadata"]["labels"]
    assert labels.get("release"), "kube-prometheus-stack selects ServiceMonitors by `release`"


def test_project_containers_keep_the_ngc_entrypoint_and_only_gpu_containers_see_gpus():
    spec = pod_spec()
    for container in [*containers(spec, init=True).values(), *containers(spec).values()]:
        name = container["name"]
        if container["image"].startswith("triton-batch-planner"):
            # Kubernetes' `command` would replace the image's entrypoint (NGC's forward
            # compatibility and driver checks); `args` runs through it
            assert "command" not in container and container["args"], name
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
        assert (env.get("NVIDIA_VISIBLE_DEVICES") == "void") == (not gpus), name


def test_the_adapter_rule_sums_the_model_instance_label_not_prometheus_own():
    from python_backend.common.contract import INSTANCE_LABEL

    assert INSTANCE_LABEL != "instance"  # Prometheus sets `instance` on every series it scrapes
    text = (K8S / "prometheus-adapter-config.yaml").read_text()
    assert f"`{INSTANCE_LABEL}` label" in text


def test_the_values_the_pod_restates_are_the_declared_defaults():
    from tools.front_door import FrontDoorSettings, env_defaults
    from tools.serve import ServeSettings

    spec = pod_spec()
    # what the pod sets otherwise on purpose: the launcher's log where kubectl reads it
    overrides = {"LOG_TO_STDOUT": "true"}
    for container, declaration in (("front-door", FrontDoorSettings), ("triton", ServeSettings)):
        env = {e["name"]: e.get("value") for e in containers(spec)[container]["env"]}
        declared = env_defaults(declaration)
        shared = set(env) & set(declared) - {"API_KEY"} - set(overrides)  # a Secret's
        assert shared, container
        assert {n: env[n] for n in shared} == {n: declared[n] for n in shared}, container
    triton = {e["name"]: e.get("value") for e in containers(spec)["triton"]["env"]}
    assert {n: triton[n] for n in overrides} == overrides


def test_the_builder_counts_the_cores_triton_will_have_for_its_fronts():
    build = containers(pod_spec(), init=True)["build-engines"]
    assert "--cores=$(TRITON_CPUS)" in build["args"]
    source = next(e for e in build["env"] if e["name"] == "TRITON_CPUS")["valueFrom"]
    field = source["resourceFieldRef"]
    # the request: with no limit set, limits.cpu reads as the node's allocatable CPU
    assert (field["containerName"], field["resource"]) == ("triton", "requests.cpu")
    triton = containers(pod_spec())["triton"]
    requested = int(triton["resources"]["requests"]["cpu"])
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    from builder.cores import default_fronts

    assert default_fronts(True, requested, None, 1) == 3  # 4 CPUs for the pod's one GPU


def test_no_two_listeners_of_the_pod_share_a_loopback_port():
    """One pod, one loopback: every address a container listens on is its own."""
    pod = pod_spec()
    listens = []
    for container in pod["containers"]:
        env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
        args = " ".join(container.get("args", []))
        listens += re.findall(r"--(?:http-|grpc-)?listen=(?:127\.0\.0\.1)?:?(\d+)", args)
        listens += [v.rsplit(":", 1)[-1] for k, v in env.items() if k.startswith("INNER_")]
        listens += [v for k, v in env.items() if k.endswith("_PORT") and k != "METRICS_PORT"]
    assert len(listens) == len(set(listens)), sorted(listens)
    door = containers(pod)["front-door"]
    door_env = {e["name"]: e.get("value", "") for e in door["env"]}
    triton_env = {e["name"]: e.get("value", "") for e in containers(pod)["triton"]["env"]}
    assert door_env["SERVE_METRICS_ADDRESS"].endswith(":" + triton_env["SERVE_METRICS_PORT"])
