"""An S3-compatible server on this machine for tests and benchmarks: moto's standalone `moto_server`, a process of
its own on a free local port (moto, flask and flask-cors are in the dev extra)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


class S3Server:
    """`moto_server` on a free local port; `env` is the environment a client process needs to reach it."""

    def __init__(self, workdir: Path):
        exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "moto.log", "w")
        self.process = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.env = {**os.environ, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {(workdir / 'moto.log').read_text()[-500:]}")
                time.sleep(0.2)

    def bucket_url(self, name: str) -> str:
        """A new bucket's URL, `s3://<name>`."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
