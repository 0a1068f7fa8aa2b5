"""The Kubernetes Pod Security Standards' `restricted` profile (which includes `baseline`), as the API server's
PodSecurity admission checks a pod: https://kubernetes.io/docs/concepts/security/pod-security-standards/ (v1.30+).

`restricted_violations(pod_spec)` returns one line per failed check, in the standard's words, so a test can show what
a rendered pod would be refused for in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.
"""

from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    out = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"host namespaces: {field}=true")
    pod_ctx = spec.get("securityContext") or {}
    for c in _containers(spec):
        ctx = c.get("securityContext") or {}
        name = c.get("name", "?")
        if ctx.get("privileged"):
            out.append(f"privileged: container {name}")
        added = set((ctx.get("capabilities") or {}).get("add", [])) - BASELINE_CAPABILITIES
        if added:
            out.append(f"capabilities: container {name} adds {sorted(added)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"host ports: container {name}")
        if ctx.get("procMount", "Default") != "Default":
            out.append(f"/proc mount type: container {name}")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"seccomp: container {name} Unconfined")
    if (pod_ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("seccomp: pod Unconfined")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v.get('name')}")
    unsafe = {s["name"] for s in pod_ctx.get("sysctls", [])} - SAFE_SYSCTLS
    if unsafe:
        out.append(f"sysctls: {sorted(unsafe)}")
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    out = baseline_violations(spec)
    pod_ctx = spec.get("securityContext") or {}
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume types: {v.get('name')} is {sorted(kinds)}")
    pod_non_root = pod_ctx.get("runAsNonRoot") is True
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if pod_ctx.get("runAsUser") == 0:
        out.append("running as non-root user: pod runAsUser=0")
    for c in _containers(spec):
        ctx = c.get("securityContext") or {}
        name = c.get("name", "?")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"privilege escalation: container {name} must set allowPrivilegeEscalation=false")
        non_root = ctx.get("runAsNonRoot", pod_non_root if "runAsNonRoot" not in ctx else None)
        if non_root is not True:
            out.append(f"running as non-root: container {name}")
        if ctx.get("runAsUser") == 0:
            out.append(f"running as non-root user: container {name} runAsUser=0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type")
        if not (seccomp in ("RuntimeDefault", "Localhost") or (seccomp is None and pod_seccomp)):
            out.append(f"seccomp: container {name} needs RuntimeDefault or Localhost")
        capabilities = ctx.get("capabilities") or {}
        if "ALL" not in capabilities.get("drop", []):
            out.append(f"capabilities: container {name} must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"capabilities: container {name} may add only NET_BIND_SERVICE")
    return out
