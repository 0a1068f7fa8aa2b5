"""Each team's FSx directory exists and belongs to the identity its pods run as, before the team can run anything.

A new Lustre file system has a root-owned `/`; a team's pods run as the team's own uid (contract.team_posix_id) and
write under `/fsx/teams/<team>` (trainer/render.py). The program registers a Job per team: these tests take that Job as the engine
recorded it, run its command for real on a directory standing in for the file system (this machine runs the tests as
root, like the Job), and check what it leaves; and that the team's queue waits for the Job in the engine's graph.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from support.repo import REPO
from support.evaluated import kubernetes_objects, manifest

from trainforge import contract
from trainforge.trainer.render import job_paths
from trainforge.trainer.spec import load_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the directory Job runs as root (chown): run the tests as root")


def directory_jobs(evaluation) -> dict[str, tuple[object, dict]]:
    return {manifest(r)["metadata"]["labels"][contract.LABEL_TEAM]: (r, manifest(r)) for r in kubernetes_objects(evaluation)
            if manifest(r)["kind"] == "Job" and manifest(r)["metadata"]["name"].startswith("fsx-dir-")}


def dockerfile_user() -> tuple[int, int]:
    uid, gid = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M).groups()
    return int(uid), int(gid)


def run_as_the_job_would(job: dict, root) -> subprocess.CompletedProcess:
    """The Job's container command with its mount path pointed at `root` (the file system stand-in)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (mount,) = container["volumeMounts"]
    command = [part.replace(mount["mountPath"], str(root)) for part in container["command"]]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_every_team_has_a_directory_job_on_the_file_systems_root(stack):
    evaluation, cfg = stack
    jobs = directory_jobs(evaluation)
    assert sorted(jobs) == sorted(t.name for t in cfg.teams)
    objects = [manifest(r) for r in kubernetes_objects(evaluation)]
    for team, (_, job) in jobs.items():
        pod = job["spec"]["template"]["spec"]
        (volume,) = pod["volumes"]
        claim = next(o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == volume["persistentVolumeClaim"]["claimName"]
                     and o["metadata"]["namespace"] == job["metadata"]["namespace"])
        pv = next(o for o in objects if o["kind"] == "PersistentVolume" and o["metadata"]["name"] == claim["spec"]["volumeName"])
        assert pv["spec"]["claimRef"] == {"namespace": job["metadata"]["namespace"], "name": claim["metadata"]["name"]}
        teams_pv = next(o for o in objects if o["kind"] == "PersistentVolume" and o["metadata"]["name"] == f"{contract.FSX_CLAIM_NAME}-{team}")
        root, theirs = pv["spec"]["csi"], teams_pv["spec"]["csi"]
        assert root["driver"] == theirs["driver"] and root["volumeAttributes"]["dnsname"] == theirs["volumeAttributes"]["dnsname"]
        assert theirs["volumeAttributes"]["mountname"] == f"{root['volumeAttributes']['mountname']}/{contract.FSX_TEAMS_DIR}/{team}", \
            "the root of the file system whose directory the team's pods mount"
        assert "ro" not in pv["spec"].get("mountOptions", [])
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == contract.FSX_MOUNT_PATH, "the root, where pods see /fsx"
        assert not job["metadata"]["namespace"].startswith("team-"), "Kueue would suspend a queue-less Job in a team namespace"


@pytest.fixture
def file_system(tmp_path):
    """A directory standing in for the Lustre root: root-owned 0755 like a new file system's `/`, and reachable by uid
    the teams' ids (pytest's own base directory is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="fsx-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def test_the_job_creates_the_teams_directory_owned_by_the_teams_identity(stack, file_system):
    evaluation, cfg = stack
    root = file_system
    assert dockerfile_user() == (contract.RUNTIME_UID, contract.RUNTIME_GID)
    jobs = directory_jobs(evaluation)
    for team, (_, job) in jobs.items():
        posix = contract.team_posix_id(team)
        for attempt in (1, 2):  # a re-run (a new `pulumi up`, a retried pod) changes nothing and succeeds
            result = run_as_the_job_would(job, root)
            assert result.returncode == 0, result.stderr
            info = (root / contract.FSX_TEAMS_DIR / team).stat()
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (posix, posix, 0o770), (team, attempt)
        assert (root / cfg.fsx.datasets_path.lstrip("/")).is_dir(), "the datasets PV mounts this directory"
        # A job of the team, as the team's identity, can write where render puts its run and checkpoints.
        spec = load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={"team": team})
        for path in job_paths(spec).values():
            local = root / path.removeprefix(contract.FSX_MOUNT_PATH + "/")
            assert as_user(posix, f'mkdir -p "{local}" && touch "{local}/ok"').returncode == 0
    # No team can read, list or write another's directory, nor rename or remove it (its parent stays root's).
    for team, other in zip(sorted(jobs), sorted(jobs)[1:] + sorted(jobs)[:1]):
        if team == other:
            continue
        theirs = root / contract.FSX_TEAMS_DIR / other
        for command in (f'ls "{theirs}"', f'touch "{theirs}/planted"', f'rm -rf "{theirs}"', f'mv "{theirs}" "{theirs}.x"'):
            assert as_user(contract.team_posix_id(team), command).returncode != 0, f"{team} could: {command}"
    assert (root / contract.FSX_TEAMS_DIR).stat().st_uid == 0


def as_user(uid: int, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], user=uid, group=uid, extra_groups=[], capture_output=True, text=True, timeout=30)


def test_a_teams_queue_waits_for_its_directory(stack):
    evaluation, _ = stack
    jobs = directory_jobs(evaluation)
    for resource in kubernetes_objects(evaluation):
        obj = manifest(resource)
        if obj["kind"] == "LocalQueue":
            team = obj["metadata"]["labels"][contract.LABEL_TEAM]
            assert jobs[team][0].urn in resource.dependencies, f"{team}'s queue could open before its directory exists"
            others = {t for t, (r, _) in jobs.items() if t != team and r.urn in resource.dependencies}
            assert not others, "a team waits only for its own directory (adding a team touches no other)"
