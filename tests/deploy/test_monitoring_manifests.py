"""k8s/monitoring: core manifests (kubernetes-validate --strict), the Prometheus Operator CRDs as dict
shapes, the alert rules with promtool (check + unit tests), and the Grafana dashboard's queries against
the metric names of a real Pushgateway scrape."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from prometheus_support import PROMTOOL, ensure_prometheus_binaries, parse_samples

MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "monitoring"
RULES = MONITORING / "prometheus" / "mtlflow.rules.yml"
DASHBOARD = MONITORING / "grafana" / "mtlflow-dashboard.json"
K8S_VERSION = "1.32.0"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
#: series Prometheus makes itself (not exported by mtlflow)
PROMETHEUS_SERIES = {"up"}
METRIC_NAME = re.compile(r"\b(mtlflow_[a-z0-9_]+|up)\b(?!\s*\()")


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(MONITORING)], capture_output=True, text=True, check=True,
                         timeout=60)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def one(objs, kind: str) -> dict:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    ensure_prometheus_binaries()
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_core_objects_pass_strict_schema_validation(objects):
    import kubernetes_validate

    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["PersistentVolumeClaim", "Deployment", "Service", "ConfigMap", "ConfigMap",
                            "ServiceMonitor", "PrometheusRule"])
    for obj in objects:
        assert obj["metadata"]["namespace"] == "mtlflow"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "mtlflow"
        if obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_service_and_servicemonitor_select_the_pushgateway(objects):
    deployment, service, monitor = one(objects, "Deployment"), one(objects, "Service"), one(objects, "ServiceMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("prom/pushgateway:v")
    assert any(a.startswith("--persistence.file=/data/") for a in container["args"])
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 9091}
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert volume == one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    # the Operator CRD, checked as a dict: apiVersion, selector, and honorLabels on the scraped port
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_prometheus_rule_carries_the_rule_file(objects):
    rule = one(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"MtlflowNonFiniteLoss", "MtlflowTrainingStalled", "MtlflowTrainingFailed", "MtlflowTeleportStorm",
            "MtlflowPipelineRunFailed"} <= set(alerts)
    for alert in alerts.values():
        assert alert["labels"]["severity"] in {"critical", "warning"} and alert["annotations"]["summary"]


def test_plain_prometheus_config_scrapes_the_pushgateway_with_honor_labels(objects):
    config = yaml.safe_load((MONITORING / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True and job["job_name"] == "mtlflow-pushgateway"
    service = one(objects, "Service")
    assert job["static_configs"][0]["targets"] == [
        f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{service['spec']['ports'][0]['port']}"]
    configmap = [o for o in objects if o["metadata"]["name"] == "mtlflow-prometheus-config"][0]
    assert yaml.safe_load(configmap["data"]["mtlflow.rules.yml"]) == yaml.safe_load(RULES.read_text())
    proc = promtool("check", "config", "prometheus.yml", cwd=MONITORING / "prometheus")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alert_rules_pass_promtool_check_and_unit_tests():
    checked = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert checked.returncode == 0 and "SUCCESS: 6 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "mtlflow.rules.test.yml", cwd=RULES.parent)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries


def test_dashboard_is_well_formed_and_its_queries_parse(tmp_path, objects):
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for p in board["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and set(p["gridPos"]) == {"x", "y", "w", "h"}
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]) >= 1
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for topic in ("training loss", "δm%", "conflict", "step time", "memory", "teleports"):
        assert topic in titles, topic
    # every panel query is valid PromQL: promtool parses it as a recording rule
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query_{i}", "expr": e}
                                                         for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.rules.yml").write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", "dashboard.rules.yml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    configmap = [o for o in objects if o["metadata"]["name"] == "mtlflow-grafana-dashboard"][0]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["mtlflow-dashboard.json"]) == board


def test_dashboard_and_alerts_query_only_exported_metrics(exported_sweep):
    """Every metric name in the dashboard's and the alerts' queries exists in a real scrape of the
    Pushgateway after a training run, a sweep comparison and a pipeline status were pushed."""
    exported = {name for name, _, _ in parse_samples(exported_sweep.text) if name.startswith("mtlflow_")}
    rules = yaml.safe_load(RULES.read_text())
    alert_exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for source, exprs in (("dashboard", dashboard_queries()), ("alerts", alert_exprs)):
        used = {m for e in exprs for m in METRIC_NAME.findall(e)} - PROMETHEUS_SERIES
        assert used, source
        assert used <= exported, f"{source} queries metrics nobody exports: {sorted(used - exported)}"
    # and the dashboard shows the headline series
    assert {"mtlflow_train_loss", "mtlflow_delta_m_percent", "mtlflow_gradient_conflict_ratio",
            "mtlflow_train_step_median_seconds", "mtlflow_train_peak_memory_bytes",
            "mtlflow_teleports_total"} <= {m for e in dashboard_queries() for m in METRIC_NAME.findall(e)}


def test_docs_document_every_exported_metric():
    from mtlflow.ops.observability import catalog

    guide = (MONITORING.parents[1] / "docs" / "guides" / "observability.md").read_text()
    missing = [m.name for m in catalog.ALL_METRICS if f"`{m.name}`" not in guide]
    assert not missing, f"docs/guides/observability.md lacks {missing}"
