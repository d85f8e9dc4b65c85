"""container/Containerfile, built and run with podman: the image runs as a non-root user, reads the
bundle from a read-only volume, answers a Wyoming client through a published port, passes its
health check and stops on SIGTERM with exit 0.

Needs podman, the runc runtime and the base image container/make_base.sh makes (no image registry
is reachable from the machines this project runs on); skipped without them. The build installs
the runtime's pinned wheels from the package index (the build uses the host's network and CA list).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO

# the session pipeline's tiny export, and an image build of minutes: `make test-container`, not `make test`
pytestmark = [pytest.mark.slow, pytest.mark.container]

BASE = "localhost/omnivoice-base:bookworm"
# This project's VMs mount cgroup v1 with one v2 controller (crun refuses "hybrid mode"; runc runs)
# and lack CAP_SYS_RESOURCE (podman's default rlimits cannot be set): flags harmless elsewhere.
RUNTIME = ["--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
BUILD_S = 900
START_S = 120


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def base_ready() -> bool:
    return bool(shutil.which("podman") and shutil.which("runc")) and podman("image", "exists", BASE).returncode == 0


@pytest.fixture(scope="module")
def image() -> str:
    if not base_ready():
        pytest.skip(f"needs podman, runc and the base image {BASE} (container/make_base.sh)")
    tag = f"localhost/omnivoice-onnx-test:{uuid.uuid4().hex[:8]}"
    done = podman(
        "build",
        *RUNTIME,
        "--format",
        "docker",
        "--network",
        "host",
        "-v",
        "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
        "--build-arg",
        f"BASE={BASE}",
        "-f",
        str(REPO / "container" / "Containerfile"),
        "-t",
        tag,
        str(REPO),
        timeout=BUILD_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield tag
    podman("rmi", "-f", tag)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_image_serves_wyoming_as_a_user_from_a_read_only_volume(image: str, pipeline, tmp_path: Path) -> None:
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info

    bundle = tmp_path / "onnx"
    shutil.copytree(pipeline.onnx, bundle)
    os.chmod(tmp_path, 0o755)
    port, name = free_port(), f"omnivoice-test-{uuid.uuid4().hex[:8]}"
    done = podman(
        "run",
        *RUNTIME,
        "-d",
        "--name",
        name,
        "-p",
        f"127.0.0.1:{port}:10200",
        "-v",
        f"{bundle}:/models:ro",
        image,
        "wyoming",
        "--model-dir",
        "/models",
        "--uri",
        "tcp://0.0.0.0:10200",
        "--allow-remote",
        "--num-step",
        "4",
    )
    assert done.returncode == 0, done.stderr
    try:
        deadline = time.monotonic() + START_S
        while "listening on" not in podman("logs", name).stdout + podman("logs", name).stderr:
            assert time.monotonic() < deadline, podman("logs", name).stderr[-3000:]
            time.sleep(0.5)
        assert podman("exec", name, "id", "-u").stdout.strip() != "0"

        async def describe() -> Info:
            async with AsyncTcpClient("127.0.0.1", port, connect_timeout=30, read_timeout=60) as client:
                await client.write_event(Describe().event())
                return Info.from_event(await client.read_event())

        info = asyncio.run(describe())
        assert "alloy" in [voice.name for voice in info.tts[0].voices]
        assert podman("healthcheck", "run", name).returncode == 0
        assert podman("stop", "-t", "30", name).returncode == 0
        assert podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
    finally:
        podman("rm", "-f", name)
