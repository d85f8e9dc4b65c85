"""omnivoice-onnx wyoming driven by third-party Wyoming clients nobody here wrote, as processes of
their own: wyoming-bench (both its modes, to the end) and wyoming-openai-gateway (an OpenAI API in
front of a Wyoming server, which waits for AudioStop or the end of the connection: a refused
request must reach its client at once, not after the server's idle timeout).

Their PyPI packages need Python >= 3.12 (requirements.txt installs them there): on an older
interpreter the module is skipped, saying so. $OMNIVOICE_PEERS_PYTHON may name a Python >= 3.12
that has them, to run these tests from an older one (the server under test is this checkout's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("wyoming")

PEERS_ENV = "OMNIVOICE_PEERS_PYTHON"
PEERS_PYTHON = sys.executable if sys.version_info >= (3, 12) else os.environ.get(PEERS_ENV)
if not PEERS_PYTHON:
    pytest.skip(
        f"wyoming-bench and wyoming-openai-gateway need Python >= 3.12 (their PyPI packages); this is "
        f"{sys.version.split()[0]} (set ${PEERS_ENV} to a Python >= 3.12 that has them)",
        allow_module_level=True,
    )

from serving import launch  # noqa: E402

from omnivoice_onnx.serve import door  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

SEED = 31
START_S = 90
CLOSE_S = 2.0  # a refused request reaches the gateway's client within this
RUN_S = 300
ENV = {**os.environ, "OMNIVOICE_ORT_THREADS": "1"}
BENCH = "import sys; from wyoming_bench.cli import main; sys.exit(main())"  # its console script (no __main__)


@pytest.fixture(scope="module")
def port(pipeline, tmp_path_factory):
    folder = tmp_path_factory.mktemp("wyoming-peers")
    launched = launch(
        pipeline.onnx,
        folder / "wyoming.log",
        "--voices",
        str(folder / "voices"),
        "--threads",
        "1",
        "--seed",
        str(SEED),
        env=ENV,
        start_timeout=START_S,
        command="wyoming",
    )
    yield launched.port
    assert launched.stop(START_S) == 0
    assert "Traceback" not in (folder / "wyoming.log").read_text()


@pytest.fixture(scope="module")
def gateway(port, tmp_path_factory):
    """wyoming-openai-gateway in front of the server, on a free port (its start line names it)."""
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    env = {**ENV, "TTS_HOST": "127.0.0.1", "TTS_PORT": str(port), "HOST": "127.0.0.1", "PORT": "0"}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [PEERS_PYTHON, "-m", "wyoming_openai_gateway"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + START_S
        while not (found := re.search(r"running on http://127\.0\.0\.1:(\d+)", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield f"http://127.0.0.1:{found.group(1)}/v1"
    finally:
        process.terminate()
        process.wait(30)


def test_wyoming_bench_runs_both_modes_to_the_end(port) -> None:
    done = subprocess.run(
        [PEERS_PYTHON, "-c", BENCH, "tts", f"127.0.0.1:{port}", "--mode", "both", "--rounds", "1",
         "--warmup", "0", "--timeout", "120", "--texts", "Turn on the kitchen lights. Then dim them a little."],
        capture_output=True, text=True, timeout=RUN_S, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for mode in ("non_streaming", "streaming"):
        assert f"[{mode}] ok=1 fail=0" in done.stdout, done.stdout[-3000:]


def test_a_refused_request_reaches_the_gateways_client_at_once(gateway) -> None:
    """The OpenAI client through the gateway: an unknown voice and a text over the limit are
    answered (an error: the gateway keeps no Wyoming message) within CLOSE_S; a good one speaks."""
    import openai

    client = openai.OpenAI(base_url=gateway, api_key="unused", max_retries=0, timeout=RUN_S)
    for voice, text in (("nobody", "Hello."), ("alloy", "x" * (door.MAX_INPUT_CHARS + 1))):
        start = time.monotonic()
        with pytest.raises(openai.APIStatusError):
            client.audio.speech.create(model="tts-1", voice=voice, input=text, response_format="wav")
        assert time.monotonic() - start < CLOSE_S, (voice, time.monotonic() - start)
    spoken = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.", response_format="wav")
    assert spoken.content[:4] == b"RIFF" and len(spoken.content) > 1000
