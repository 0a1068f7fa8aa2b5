"""The durable tier against a real S3 endpoint (moto's server) on loopback: no patched functions."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
boto3 = pytest.importorskip("boto3")

from support.servers import free_port, moto_server  # noqa: E402
from support.training import BASE, result, run, start, wait_for_step  # noqa: E402
from support.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(tmp_path, monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with moto_server(tmp_path) as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="ckpt")
        yield endpoint, client


def remote_steps(client, prefix: str) -> list[int]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="ckpt", Prefix=prefix).get("Contents", [])]
    return sorted(int(k.split("step-")[1].split("/")[0]) for k in keys if k.endswith("/COMMITTED"))


def test_committed_checkpoints_reach_s3_and_a_wiped_node_resumes_from_there(tmp_path, s3):
    endpoint, client = s3
    uri = "s3://ckpt/teams/vision/job-1"
    overrides = [f"checkpoint.s3_uri={uri}", f"checkpoint.s3_endpoint_url={endpoint}", "max_steps=30"]
    run(tmp_path, *overrides)
    local = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    # The first and the newest commits always go up; one in between may be superseded while an upload runs (by design:
    # a newer commit replaces one still waiting, s3.py), which a busy machine makes happen (CI saw [10, 30]).
    remote = remote_steps(client, "teams/vision/job-1/")
    assert remote[0] == 10 and remote[-1] == 30 and set(remote) <= {10, 20, 30}, remote
    marker = json.loads(client.get_object(Bucket="ckpt", Key="teams/vision/job-1/step-00000030/COMMITTED")["Body"].read())
    for name, size in marker["files"].items():
        assert client.head_object(Bucket="ckpt", Key=f"teams/vision/job-1/step-00000030/{name}")["ContentLength"] == size
    assert local == ["step-00000010", "step-00000020", "step-00000030"]

    shutil.rmtree(tmp_path / "checkpoints")  # a new node: the local tier is empty
    resumed = run(tmp_path, *overrides[:-1], "max_steps=40")
    assert "downloaded checkpoint step 30" in resumed.stderr
    assert result(tmp_path)["resumed_from"] == 30 and result(tmp_path)["step"] == 40


def test_two_nodes_sharing_an_empty_local_tier_resume_from_one_download(tmp_path, s3):
    """Two nodes on loopback, each under the node launcher as on the cluster, sharing one checkpoint directory (FSx):
    the local tier was lost, so the newest checkpoint comes down from S3, once. Each node's first rank used to download
    it into the same directory at the same time, and the one that lost the rename failed the job as a user error."""
    endpoint, client = s3
    overrides = ["checkpoint.s3_uri=s3://ckpt/teams/vision/job-2", f"checkpoint.s3_endpoint_url={endpoint}"]
    run(tmp_path, *overrides, "max_steps=30", nproc=None)
    shutil.rmtree(tmp_path / "checkpoints")
    port = free_port()
    sets = [a for o in [*BASE, *overrides, "max_steps=40"] for a in ("--set", o)]
    nodes = [subprocess.Popen([sys.executable, "-m", "trainforge.trainer.launch", "--nproc-per-node=1", f"--exit-dir={tmp_path}/exit{rank}",
                               "--", "--nnodes=2", f"--node-rank={rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                               "--rdzv-id=s3-resume", "-m", "trainforge.trainer.runtime", *sets],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        logs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert sum(log.count("downloaded checkpoint step 30") for log in logs) == 1, "one download, by rank 0"
    assert result(tmp_path)["resumed_from"] == 30 and result(tmp_path)["step"] == 40
    assert not list((tmp_path / "checkpoints").glob(".download-*")), "nothing half-downloaded left"


def test_training_goes_on_while_the_endpoint_is_down_and_catches_up_when_it_returns(tmp_path, monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    port = free_port()  # nothing listens here yet: connection refused, for real
    job = start(tmp_path, "checkpoint.s3_uri=s3://ckpt/job-2", f"checkpoint.s3_endpoint_url=http://127.0.0.1:{port}",
                "max_steps=200", "step_sleep_s=0.05", nproc=None)
    wait_for_step(tmp_path, 40)
    with moto_server(tmp_path, port) as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="ckpt")
        output, _ = job.communicate(timeout=180)
        assert job.returncode == 0, output[-3000:]
        assert "S3 upload of step" in output and "training goes on" in output
        records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in records if "loss" in r]
        assert steps == list(range(10, 201, 10)), "a training step was lost to the outage (every log step is recorded)"
        wait_until(lambda: 200 in remote_steps(client, "job-2/"), 30, interval=0.5,
                   what="the newest checkpoint to reach S3 after the endpoint came back")


def test_an_unreachable_endpoint_at_start_falls_back_to_the_local_tier(tmp_path, monkeypatch):
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    run(tmp_path, "max_steps=30", nproc=None)
    dead = f"http://127.0.0.1:{free_port()}"
    resumed = run(tmp_path, "max_steps=40", "checkpoint.s3_uri=s3://ckpt/job-3", f"checkpoint.s3_endpoint_url={dead}",
                  "checkpoint.s3_close_timeout_s=3", nproc=None)
    assert "resuming from the local tier only" in resumed.stderr
    assert "the last checkpoint did not reach S3 within 3 s" in resumed.stderr
    assert result(tmp_path)["resumed_from"] == 30


def test_the_uploader_survives_a_missing_bucket_and_uploads_once_it_exists(tmp_path, monkeypatch):
    """S3 answers but the bucket is not there yet (boto3 raises S3UploadFailedError): retried, never fatal."""
    from trainforge.trainer.runtime.checkpoint_files import COMMIT_MARKER, Committed
    from trainforge.trainer.runtime.s3 import S3Tier

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    step_dir = tmp_path / "step-00000007"
    step_dir.mkdir()
    (step_dir / "shard.bin").write_bytes(b"x" * 1000)
    (step_dir / COMMIT_MARKER).write_text(json.dumps({"step": 7, "files": {"shard.bin": 1000}, "committed_at": time.time()}))
    events = []
    with moto_server(tmp_path) as endpoint:
        tier = S3Tier("s3://late-bucket/job", endpoint_url=endpoint, backoff_s=0.2, on_event=lambda name, value: events.append(name))
        tier.enqueue(Committed(7, step_dir, None, time.time()))
        wait_until(lambda: "upload_failures" in events, 20, interval=0.05, what="the upload to a missing bucket to fail")
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="late-bucket")
        assert tier.flush(timeout=30), "the uploader stopped after the first failure"
        assert client.head_object(Bucket="late-bucket", Key="job/step-00000007/COMMITTED")["ContentLength"] > 0
        tier.close(5)
