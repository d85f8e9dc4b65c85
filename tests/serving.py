"""`omnivoice-onnx serve` started as a child process for the tests and the server bench: its
port read from the start line (`--port 0`, so there is no race for a free port), stopped with
SIGTERM and a bounded wait. A test helper (bench/bench_server.py borrows it), not part of the runtime's wheel.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import omnivoice_onnx

# The folder holding the omnivoice_onnx this process imported: the child's `python -m omnivoice_onnx`
# must find the same package from any working directory (a checkout is not installed).
PACKAGE_ROOT = str(Path(omnivoice_onnx.__file__).resolve().parent.parent)


@dataclass
class Launched:
    """A server started by `launch`: its process, its port and its log file."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait (bounded) for the drain and exit; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise
        return self.process.returncode


def launch(
    model_dir: Path,
    log: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    start_timeout: float = 60.0,
    command: str = "serve",
) -> Launched:
    """`omnivoice-onnx serve --model-dir M --port 0 FLAGS` as a child process, once it listens: the
    port is read from its start line, so there is no race for a free port (tests, benches).
    command="wyoming" starts `omnivoice-onnx wyoming --uri tcp://127.0.0.1:0` the same way."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    with open(log, "w") as handle:
        where = ["--port", "0"] if command == "serve" else ["--uri", "tcp://127.0.0.1:0"]
        process = subprocess.Popen(
            [sys.executable, "-m", "omnivoice_onnx", command, "--model-dir", str(model_dir), *where, *flags],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        found = re.search(re.escape(f"omnivoice-onnx {command}: listening on ") + r"\S+:(\d+)", Path(log).read_text())
        if found:
            return Launched(process, int(found.group(1)), Path(log))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    process.wait(10)
    raise RuntimeError(f"the server did not start within {start_timeout:g} s; its log: {log}")
