"""The Pod Security Standards' "restricted" profile (which includes "baseline"), checked offline on a pod spec as
the Pod Security admission controller checks it (https://kubernetes.io/docs/concepts/security/pod-security-standards/,
policy version v1.32): every rule of the two profiles that a pod spec can break, written from that table.
OpenShift's restricted-v2 SCC asks for the same container settings and, unlike a fixed ``runAsUser``, accepts a
pod that leaves the UID to it. Also the merge of a TrainingRuntime's pod template with a TrainJob's runtime
patch, so the pod a TrainJob gets can be checked."""

from __future__ import annotations

import copy
from typing import Any

#: baseline: capabilities a container may add
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
#: baseline: the safe sysctls
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
#: restricted: the only volume types
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def violations(pod: dict[str, Any]) -> list[str]:
    """Every rule of the restricted profile ``pod`` (a PodSpec) breaks, one line each; [] when it passes."""
    found = []
    pod_ctx = pod.get("securityContext") or {}
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    assert pod.get("containers"), f"not a pod spec (no containers): {sorted(pod)}"
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{field} is true")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            found.append(f"volume {volume['name']} is a hostPath")
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} has a type outside the restricted set: {sorted(kinds)}")
    for sysctl in pod_ctx.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']} is not a safe one")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        found.append("the pod's seccompProfile is Unconfined")
    if pod_ctx.get("runAsUser") == 0:
        found.append("the pod runs as UID 0")
    for c in containers:
        ctx, name = c.get("securityContext") or {}, c["name"]
        if ctx.get("privileged"):
            found.append(f"container {name} is privileged")
        if any(port.get("hostPort") for port in c.get("ports") or []):
            found.append(f"container {name} uses a hostPort")
        if ctx.get("procMount", "Default") != "Default":
            found.append(f"container {name} has procMount {ctx['procMount']}")
        capabilities = ctx.get("capabilities") or {}
        added = set(capabilities.get("add") or [])
        if not added <= BASELINE_CAPABILITIES:
            found.append(f"container {name} adds {sorted(added - BASELINE_CAPABILITIES)}")
        if not added <= {"NET_BIND_SERVICE"}:
            found.append(f"container {name} adds capabilities other than NET_BIND_SERVICE: {sorted(added)}")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"container {name} does not drop ALL capabilities")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name} does not set allowPrivilegeEscalation: false")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            found.append(f"container {name} is not runAsNonRoot (neither it nor the pod sets it)")
        if ctx.get("runAsUser") == 0:
            found.append(f"container {name} runs as UID 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"container {name} has no RuntimeDefault or Localhost seccompProfile (neither it nor the pod)")
    return found


def merged(base: Any, patch: Any) -> Any:
    """A strategic merge of ``patch`` into ``base`` as the Trainer applies a TrainJob's runtime patch to the
    runtime's pod template: maps merge key by key, lists of named items (containers, volumes) merge by name,
    other lists (tolerations, imagePullSecrets) are taken from the patch."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merged(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i
                                                                   for i in [*base, *patch]):
        out = [copy.deepcopy(i) for i in base]
        for item in patch:
            same = next((n for n, b in enumerate(out) if b["name"] == item["name"]), None)
            if same is None:
                out.append(copy.deepcopy(item))
            else:
                out[same] = merged(out[same], item)
        return out
    return copy.deepcopy(patch)
