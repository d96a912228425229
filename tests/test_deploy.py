"""Deployment files: Kubernetes manifests, compose file, Grafana dashboard, Dockerfile. All offline.

The manifests are checked against the Kubernetes OpenAPI schemas that
``kubernetes-validate`` ships, in strict mode (an unknown field is an error);
the compose file against the Compose specification that ``check-jsonschema``
ships. Neither needs a cluster, a Docker engine or the network.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.metrics import Metrics
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
#: The oldest Kubernetes the manifests claim (README there), and the newest whose schemas the validator ships.
K8S_VERSIONS = ["1.30", str(kubernetes_validate.latest_version())]
SETTING_VARS = {"CTXPROXY_" + f.name.upper() for f in fields(Settings)}
#: The contract's metric families (CONTRACT.md, "Metrics").
CONTRACT_METRICS = {
    "ctxproxy_requests_total", "ctxproxy_compactions_total", "ctxproxy_compaction_seconds",
    "ctxproxy_tokens_before_compaction_total", "ctxproxy_tokens_after_compaction_total",
    "ctxproxy_reactive_retries_total", "ctxproxy_log_entries_total", "ctxproxy_store_errors_total",
    "ctxproxy_upstream_seconds", "ctxproxy_overhead_seconds", "ctxproxy_sessions_active",
}


def k8s_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                yield path.name, doc


def k8s(kind: str) -> dict[str, Any]:
    (doc,) = [doc for _, doc in k8s_documents() if doc["kind"] == kind]
    return doc


# ---- Kubernetes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", [pytest.param(doc, id=f"{name}:{doc['kind']}") for name, doc in k8s_documents()])
def test_k8s_manifest_is_valid(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_k8s_validator_really_checks_offline() -> None:
    """The schemas ship with the package, and strict mode refuses a misspelt field."""
    deployment = k8s("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    broken = {**deployment, "spec": {**deployment["spec"], "template": {**deployment["spec"]["template"], "spec": {
        **deployment["spec"]["template"]["spec"],
        "containers": [{**container, "readinesProbe": container["readinessProbe"]}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")


def test_k8s_settings_are_real_settings() -> None:
    config = k8s("ConfigMap")["data"]
    secret = k8s("Secret")["stringData"]
    assert set(config) | set(secret) <= SETTING_VARS
    assert not set(config) & set(secret)
    assert "CTXPROXY_STORE" in secret, "a store URL may hold a password"
    settings = Settings.from_env({**config, **secret})
    assert settings.store.startswith("redis://") and settings.host == "0.0.0.0"


def test_k8s_deployment_wiring() -> None:
    deployment = k8s("Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] >= 2
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"},
                                      "limits": {"cpu": "1", "memory": "512Mi"}}
    assert {ref.get("configMapRef", ref.get("secretRef"))["name"] for ref in container["envFrom"]} == {
        k8s("ConfigMap")["metadata"]["name"], k8s("Secret")["metadata"]["name"]}
    port = int(k8s("ConfigMap")["data"]["CTXPROXY_PORT"])
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    service = k8s("Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    hpa = k8s("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]


# ---- Compose and Prometheus -----------------------------------------------------------------------


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True, timeout=60,
    )


def test_compose_file_follows_the_compose_spec() -> None:
    result = check_compose(DEPLOY / "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_check_really_checks(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  proxy:\n    image: ctxproxy\n    portz: ['8787:8787']\n")
    assert check_compose(broken).returncode != 0


def test_compose_wiring() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    proxy, redis = services["ctxproxy"], services["redis"]
    assert set(proxy["environment"]) <= SETTING_VARS
    assert proxy["environment"]["CTXPROXY_STORE"] == "redis://redis:6379/0"
    assert (DEPLOY / proxy["build"]["context"] / proxy["build"]["dockerfile"]).resolve() == ROOT / "Dockerfile"
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    volume = redis["volumes"][0].split(":")
    assert volume[0] in compose["volumes"] and volume[1] == "/data", "AOF on a named volume"
    assert services["prometheus"]["profiles"] == ["monitoring"] == services["grafana"]["profiles"]
    assert "profiles" not in proxy and "profiles" not in redis
    for service in ("prometheus", "grafana"):
        for mount in services[service]["volumes"]:
            source = mount.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"{service} mounts missing {source}"


def test_prometheus_scrapes_the_proxy() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["ctxproxy"] and sd["port"] == 8787


# ---- Grafana ------------------------------------------------------------------------------------------


def defined_series() -> set[str]:
    """Every series name the proxy's registry can expose (counters as ``_total``, histograms as parts)."""
    suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_count", "_sum", "_created"]}
    names = set()
    for family in Metrics().registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_exprs(item)


def test_grafana_dashboard_uses_only_defined_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "ctxproxy-dashboard.json").read_text())
    exprs = list(dashboard_exprs(dashboard))
    used = {name for expr in exprs for name in re.findall(r"\b(?:ctxproxy|process)_[a-z0-9_]+", expr)}
    defined = defined_series()
    assert used <= defined, f"not defined by proxy/metrics.py: {sorted(used - defined)}"
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    assert families >= CONTRACT_METRICS, f"no panel for {sorted(CONTRACT_METRICS - families)}"
    assert {panel["id"] for panel in dashboard["panels"]} == set(range(1, len(dashboard["panels"]) + 1))


# ---- Dockerfile ------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", "", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            out.append((instruction.upper(), args.strip()))
    return out


def test_dockerfile_shape() -> None:
    steps = dockerfile_instructions()
    args = {k: v for k, v in (a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)}
    assert [i for i, _ in steps].count("FROM") == 2, "multi-stage"
    assert all("slim" in args.get(a.split()[0].strip("${}"), a) for i, a in steps if i == "FROM")
    user = [a for i, a in steps if i == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    (healthcheck,) = [a for i, a in steps if i == "HEALTHCHECK"]
    assert "/healthz" in healthcheck
    runtime_env = " ".join(a for i, a in steps[[i for i, _ in steps].index("FROM", 1):] if i == "ENV")
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in runtime_env
    assert "CTXPROXY_HOST=0.0.0.0" in runtime_env
    assert [a for i, a in steps if i == "ENTRYPOINT"] == ['["ctxproxy", "serve"]']
    assert not [a for i, a in steps if i == "CMD"], "configuration by environment only"


def test_dockerignore_admits_everything_the_build_copies() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "an allow-list"
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    for instruction, args in dockerfile_instructions():
        if instruction == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert source in allowed, f"COPY {source} is excluded by .dockerignore"
                assert (ROOT / source).exists()


def test_dockerfile_splits_litellm_from_the_other_dependencies(tmp_path: Path) -> None:
    """Runs the build's own dependency step on the real pyproject.toml (pip left out)."""
    (step,) = [a for i, a in dockerfile_instructions() if i == "RUN" and "tomllib" in a]
    script = step.split(" && pip ")[0]
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    subprocess.run(["sh", "-c", script.replace("python ", f"{sys.executable} ", 1)], cwd=tmp_path, check=True,
                   timeout=60)
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    litellm = (tmp_path / "litellm.txt").read_text().splitlines()
    rest = (tmp_path / "deps.txt").read_text().splitlines()
    assert len(litellm) == 1 and litellm[0].startswith("litellm")
    assert sorted(litellm + rest) == sorted(deps)


def slim_litellm() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slim_litellm", DEPLOY / "slim_litellm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slim_litellm_keeps_exactly_what_the_proxy_reads(tmp_path: Path) -> None:
    slim = slim_litellm()
    root = tmp_path / "litellm"
    kept = ["__init__.py", "model_prices_and_context_window_backup.json",
            "litellm_core_utils/tokenizers/9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
            "litellm_core_utils/tokenizers/__init__.py"]
    dropped = ["main.py", "proxy/server.py", "llms/openai/chat.py", "litellm_core_utils/utils.py",
               "litellm_core_utils/__init__.py", "model_prices_and_context_window.json"]
    for name in kept + dropped:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x" * 10)
    freed = slim.prune(root, slim.keep_paths(root))
    remaining = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert remaining == sorted(kept)
    assert freed == 10 * len(dropped)


def test_the_installed_litellm_has_what_the_image_needs() -> None:
    """The check the image build runs after slimming, here on the development install (nothing removed)."""
    assert slim_litellm().check() == []
