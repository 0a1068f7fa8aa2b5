"""Each team's FSx directory exists and belongs to the identity its pods run as, before the team can run anything.

A new Lustre file system has a root-owned `/`; the runtime image runs as uid 1000 (Dockerfile) and writes under
`/fsx/teams/<team>` (trainer/render.py). The program registers a Job per team: these tests take that Job as the engine
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
from conftest import REPO
from test_platform_layer import kubernetes_objects, manifest

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
        same = ("driver", "volumeHandle", "volumeAttributes")
        assert {k: pv["spec"]["csi"][k] for k in same} == {k: teams_pv["spec"]["csi"][k] for k in same}, \
            "the same file system (and Lustre mount) the team's pods get"
        assert "ro" not in pv["spec"].get("mountOptions", [])
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == contract.FSX_MOUNT_PATH, "the root, where pods see /fsx"
        assert not job["metadata"]["namespace"].startswith("team-"), "Kueue would suspend a queue-less Job in a team namespace"


@pytest.fixture
def file_system(tmp_path):
    """A directory standing in for the Lustre root: root-owned 0755 like a new file system's `/`, and reachable by uid
    1000 (pytest's own base directory is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="fsx-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def test_the_job_creates_the_teams_directory_owned_by_the_runtime_user(stack, file_system):
    evaluation, cfg = stack
    tmp_path = file_system
    uid, gid = dockerfile_user()
    assert (uid, gid) == (contract.RUNTIME_UID, contract.RUNTIME_GID)
    for team, (_, job) in directory_jobs(evaluation).items():
        for attempt in (1, 2):  # a re-run (a new `pulumi up`, a retried pod) changes nothing and succeeds
            result = run_as_the_job_would(job, tmp_path)
            assert result.returncode == 0, result.stderr
            made = tmp_path / "teams" / team
            info = made.stat()
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, 0o770), (team, attempt)
        # A job of the team, as the runtime's user, can write where render puts its run and checkpoints.
        spec = load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={"team": team})
        for path in job_paths(spec).values():
            assert path.startswith(contract.fsx_team_dir(team) + "/")
            local = tmp_path / path.removeprefix(contract.FSX_MOUNT_PATH + "/")
            write = subprocess.run(["sh", "-c", f'mkdir -p "{local}" && touch "{local}/ok"'], user=uid, group=gid,
                                   capture_output=True, text=True, timeout=30)
            assert write.returncode == 0, write.stderr
    # The root stays root's: no team can rename or remove another's directory.
    assert (tmp_path / "teams").stat().st_uid == 0


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
