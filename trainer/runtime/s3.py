"""The durable checkpoint tier: every committed checkpoint is copied to S3 in the background.

Uploads run on one background thread with boto3's multipart, multi-threaded transfers; the commit marker
goes last, so a remote checkpoint is visible only when complete (the same rule as on disk). A newer commit
supersedes an older one still waiting, so an outage never builds a backlog. An unreachable endpoint costs
warnings, retries with backoff and a failure counter, never a training step.

Rank 0 uploads the whole directory, so the local tier must be visible to every rank: a local disk on one
machine, the FSx mount on the cluster. On start, when S3 holds a newer committed checkpoint than the local
tier (a fresh node, a wiped disk), it is downloaded before resuming.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from trainforge import models
from trainforge.trainer.runtime.checkpoint_files import COMMIT_MARKER, STEP_PREFIX, Committed, scan, step_dir_name

log = logging.getLogger("trainforge.runtime")
S3_URI = re.compile(models.S3_URI)
# upload_file wraps S3's own errors (NoSuchBucket, AccessDenied...) in S3UploadFailedError, outside botocore's tree.
TRANSFER_ERRORS = (BotoCoreError, ClientError, S3UploadFailedError, OSError)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        match = S3_URI.match(uri)
        if match is None:
            raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
        return cls(match["bucket"], (match["prefix"] or "").strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


class S3Tier:
    def __init__(self, uri: str, *, endpoint_url: str | None = None, max_concurrency: int = 8, retries: int = 4,
                 backoff_s: float = 0.5, on_event: Callable[[str, float], None] | None = None):
        self.location = S3Location.parse(uri)
        # Few, fast retries inside botocore: our own loop owns the backoff, so a dead endpoint is noticed in
        # seconds rather than after botocore's minutes of retrying.
        self.client = boto3.client("s3", endpoint_url=endpoint_url, config=Config(
            retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=2, read_timeout=60))
        self.transfer = TransferConfig(multipart_threshold=8 * 2**20, multipart_chunksize=16 * 2**20,
                                       max_concurrency=max_concurrency, use_threads=True)
        self.retries, self.backoff_s = retries, backoff_s
        self.on_event = on_event or (lambda name, value: None)
        self._wanted: Committed | None = None  # newest committed checkpoint not yet uploaded
        self._uploaded_step: int | None = None
        self._wanted_since: float | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trainforge-s3-upload", daemon=True)
        self._thread.start()

    # ---- upload ------------------------------------------------------------------------------------------

    def enqueue(self, committed: Committed) -> None:
        with self._cv:
            if self._wanted is None:
                self._wanted_since = committed.committed_at
            self._wanted = committed
            self._cv.notify()

    def lag_seconds(self) -> float:
        """How long the newest local checkpoint has waited for S3 (0 when S3 is up to date)."""
        with self._cv:
            return 0.0 if self._wanted_since is None else max(0.0, time.time() - self._wanted_since)

    def flush(self, timeout: float) -> bool:
        """Wait until the newest committed checkpoint is in S3; False if `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._wanted is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 60.0) -> bool:
        done = self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        return done

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._wanted is None and not self._closed:
                    self._cv.wait()
                if self._wanted is None:
                    return
                target = self._wanted
            try:
                self._upload_with_retries(target)
            except Exception:  # noqa: BLE001 - a dead uploader would silently stop every later upload
                log.exception("unexpected error uploading step %d; will retry with the next checkpoint", target.step)
                self.on_event("upload_failures", 1)
                with self._cv:
                    self._cv.wait(self.backoff_s)

    def _upload_with_retries(self, target: Committed) -> None:
        attempt = 0
        while True:
            try:
                started = time.perf_counter()
                size = self._upload(target)
                self.on_event("upload_seconds", time.perf_counter() - started)
                self.on_event("upload_bytes", size)
                break
            except TRANSFER_ERRORS as exc:
                attempt += 1
                self.on_event("upload_failures", 1)
                with self._cv:
                    superseded = self._wanted is not target
                if superseded:
                    log.warning("S3 upload of step %d failed (%s); a newer checkpoint supersedes it", target.step, exc)
                    return
                delay = min(30.0, self.backoff_s * 2 ** min(attempt - 1, 6))
                log.warning("S3 upload of step %d to s3://%s/%s failed (attempt %d: %s); retrying in %.1f s; training goes on",
                            target.step, self.location.bucket, self.location.prefix, attempt, exc, delay)
                with self._cv:
                    self._cv.wait(delay)
                    if self._closed and attempt >= self.retries:
                        log.error("giving up on S3 upload of step %d after %d attempts", target.step, attempt)
                        self._wanted, self._wanted_since = None, None
                        self._cv.notify_all()
                        return
        with self._cv:
            self._uploaded_step = target.step
            if self._wanted is target:
                self._wanted, self._wanted_since = None, None
            self._cv.notify_all()
        log.info("checkpoint step %d is in s3://%s/%s", target.step, self.location.bucket, self.location.key(target.path.name))

    def _upload(self, target: Committed) -> int:
        manifest = json.loads((target.path / COMMIT_MARKER).read_text())
        size = 0
        for name, nbytes in manifest["files"].items():  # data first ...
            self.client.upload_file(str(target.path / name), self.location.bucket, self.location.key(target.path.name, name),
                                    Config=self.transfer)
            size += nbytes
        self.client.upload_file(str(target.path / COMMIT_MARKER), self.location.bucket,  # ... the marker last
                                self.location.key(target.path.name, COMMIT_MARKER), Config=self.transfer)
        return size

    # ---- download ----------------------------------------------------------------------------------------

    def remote_steps(self) -> list[int]:
        """Steps with a commit marker in S3, oldest first."""
        steps = []
        paginator = self.client.get_paginator("list_objects_v2")
        prefix = self.location.key(STEP_PREFIX)
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                m = re.search(rf"{STEP_PREFIX}(\d+)/{COMMIT_MARKER}$", item["Key"])
                if m:
                    steps.append(int(m.group(1)))
        return sorted(steps)

    def sync_down(self, local_dir: Path) -> int | None:
        """Download the newest remote checkpoint if the local tier has nothing as new. Returns its step."""
        try:
            remote = self.remote_steps()
        except TRANSFER_ERRORS as exc:
            log.warning("cannot list checkpoints in s3://%s/%s (%s); resuming from the local tier only",
                        self.location.bucket, self.location.prefix, exc)
            return None
        local, _ = scan(local_dir)
        if not remote or (local and local[-1].step >= remote[-1]):
            return None
        step = remote[-1]
        name = step_dir_name(step)
        target = local_dir / name
        partial = local_dir / f".download-{name}"
        partial.mkdir(parents=True, exist_ok=True)
        marker = self.client.get_object(Bucket=self.location.bucket, Key=self.location.key(name, COMMIT_MARKER))["Body"].read()
        for file_name in json.loads(marker)["files"]:
            self.client.download_file(self.location.bucket, self.location.key(name, file_name), str(partial / file_name),
                                      Config=self.transfer)
        (partial / COMMIT_MARKER).write_bytes(marker)  # last, as on upload
        if target.exists():
            import shutil
            shutil.rmtree(target)
        partial.rename(target)
        log.info("downloaded checkpoint step %d from s3://%s/%s", step, self.location.bucket, self.location.key(name))
        return step
