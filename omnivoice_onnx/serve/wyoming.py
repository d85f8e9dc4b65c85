"""A Wyoming server over the torch-free runtime (`omnivoice-onnx wyoming`), for Home Assistant.

    pip install 'omnivoice-onnx[wyoming]'
    omnivoice-onnx wyoming --model-dir onnx --uri tcp://127.0.0.1:10200

Home Assistant's local voice pipeline speaks Wyoming (https://github.com/OHF-Voice/wyoming), not
HTTP: add this server as its "Wyoming Protocol" integration (host, port). Events (the `wyoming`
package's own classes):
- Describe -> Info: one TtsProgram "omnivoice-onnx" whose voices are the saved voices, the OpenAI-
  named presets (omnivoice_onnx.presets) and "auto", each described by its name and a few words,
  with the languages Home Assistant can name (the model's two-letter ids, ar, or, yue: about 130 of
  its 646); a request's language may be any name, id or tag the runtime resolves (eng, en-US).
- Synthesize(text, voice) -> AudioStart, AudioChunk... (16-bit mono PCM at 24 kHz, sent as
  OmniVoiceOnnx.stream() decodes each sentence-sized chunk), AudioStop.
- SynthesizeStart, SynthesizeChunk..., SynthesizeStop (streamed text, wyoming >= 1.7): each
  completed sentence is spoken as soon as it arrives, inside one AudioStart..AudioStop, then
  SynthesizeStopped. A Synthesize sent alongside (clients do, for older servers) is ignored.
- A refused request -> Error(text, code): the HTTP server's message and code.

Requests go through the HTTP server's machinery (omnivoice_onnx.serve.app): the same voice
resolution, limits (input up to server_service.MAX_INPUT_CHARS), validation, queue and timeout. The
protocol carries no seed: each request gets the preset's seed for a preset voice, else a fresh
one, and the log line names it; --seed N fixes it for every request (then the audio equals
stream(text, seed=N) of the voice, bit for bit as 16-bit PCM). A streamed request keeps the seed
of its first sentence for the rest. With random weights (test bundles) every voice speaks noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import signal
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from omnivoice_onnx.audio_out import to_pcm16
from omnivoice_onnx.core.prompt import advertised_languages
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.serve import pool as server_pool
from omnivoice_onnx.serve import service as server_service
from omnivoice_onnx.version import __version__

LOG = logging.getLogger("omnivoice_onnx.wyoming")

DEFAULT_URI = "tcp://127.0.0.1:10200"  # wyoming-piper's port is 10200 too; one of them per machine
DEFAULT_VOICE = "alloy"  # the voice of a request that names none
LISTENING = "omnivoice-onnx wyoming: listening on "  # the start line's prefix (serving.launch reads it)
SAMPLE_WIDTH = 2  # bytes per sample: 16-bit PCM, what Home Assistant plays
# Home Assistant labels a voice by its description: the name, then a few words ("alloy: female,
# young adult, moderate pitch, american accent" fits; a long saved instruct is cut at a comma).
MAX_DESCRIPTION_CHARS = 64
AUTO_DESCRIPTION = "a voice the model picks"
ATTRIBUTION = ("k2-fsa OmniVoice", "https://github.com/k2-fsa/OmniVoice")
# mDNS discovery as wyoming-piper does it (the wyoming package's zeroconf module): Home Assistant
# browses this type and offers each server it finds under its name.
ZEROCONF_TYPE = "_wyoming._tcp.local."
ZEROCONF_NAME = "omnivoice-onnx"  # --zeroconf without a name
MDNS_GROUP = "224.0.0.251"  # a UDP socket "connected" here names the interface mDNS leaves by (sends nothing)
# A sentence is complete once its end mark (and any closing quote or bracket) is followed by
# whitespace: "Dr. Smith" may still split early, which costs a pause, never words.
SENTENCE_END = re.compile(r"[.!?;:\u3002\uff01\uff1f\uff1b][\"')\]\u201d\u2019\u300d]*\s")


@dataclass
class WyomingConfig:
    """What `omnivoice-onnx wyoming` was asked for, beyond the HTTP server's loading options."""

    uri: str = DEFAULT_URI
    seed: int | None = None  # every request's seed (None: the preset's, else a fresh one, logged)
    voice: str = DEFAULT_VOICE
    zeroconf: str | None = None  # the service name announced over mDNS (None: not announced)


def parse_uri(uri: str) -> tuple[str, int]:
    """(host, port) of a tcp://HOST:PORT uri; UserError naming the fix otherwise."""
    parsed = urlparse(uri)
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme != "tcp" or not parsed.hostname or port is None:
        raise UserError(f"--uri {uri} is not tcp://HOST:PORT", "pass e.g. --uri tcp://127.0.0.1:10200 (0: any port)")
    return parsed.hostname, port


def voice_entries(service: server_service.Service) -> list[server_service.VoiceEntry]:
    """The voices a client may pick: saved, presets, then auto ("design" needs a description,
    which the protocol cannot send)."""
    catalogue = service.voice_catalogue()
    return ([entry for entry in catalogue if entry.kind != "builtin"]
            + [entry for entry in catalogue if entry.kind == "builtin" and entry.name == "auto"])


def voice_names(service: server_service.Service) -> list[str]:
    return [entry.name for entry in voice_entries(service)]


def description(entry: server_service.VoiceEntry) -> str:
    """A voice's label in Home Assistant's picker, which shows the description (else the name):
    the name first, then what the voice is, cut at a comma to MAX_DESCRIPTION_CHARS."""
    what = {"builtin": AUTO_DESCRIPTION, "clone": "cloned voice"}.get(entry.kind) or entry.text or "designed voice"
    line = f"{entry.name}: {what}"
    while len(line) > MAX_DESCRIPTION_CHARS and ", " in line:
        line = line.rsplit(", ", 1)[0]
    return line if len(line) <= MAX_DESCRIPTION_CHARS else line[:MAX_DESCRIPTION_CHARS - 1] + "\u2026"


def describe(service: server_service.Service) -> Any:
    """The Info event's content: one TTS program and its voices, each with the languages Home
    Assistant can name (prompt.advertised_languages; a request may still name any of the model's)."""
    from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

    attribution = Attribution(*ATTRIBUTION)
    languages = advertised_languages(service.pool.models[0].runtime_config["languages"])
    voices = [TtsVoice(name=entry.name, attribution=attribution, installed=True, description=description(entry),
                       version=None, languages=languages) for entry in voice_entries(service)]
    program = TtsProgram(name="omnivoice-onnx", attribution=attribution, installed=True, version=__version__,
                         description="OmniVoice text to speech (ONNX, no torch)", voices=voices,
                         supports_synthesize_streaming=True)
    return Info(tts=[program])


class Refused(Exception):
    """A request the client gets an Error event for."""

    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(message)
        self.message, self.code = message, code


class Session:
    """One client connection: its events in, audio and errors out."""

    def __init__(self, service: server_service.Service, config: WyomingConfig, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.service, self.config, self.reader, self.writer = service, config, reader, writer
        self.streaming: dict[str, Any] | None = None  # between SynthesizeStart and SynthesizeStop
        self.jobs: list[server_pool.Job] = []  # running, cancelled if the connection or the server ends

    async def write(self, event: Any) -> None:
        from wyoming.event import async_write_event

        await async_write_event(event.event(), self.writer)

    async def run(self) -> None:
        from wyoming.event import async_read_event

        try:
            while (event := await async_read_event(self.reader)) is not None:
                await self.handle(event)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: its work is cancelled below
        except Exception:  # a bug: logged with its traceback; the client gets one line, the server goes on
            LOG.exception("wyoming request failed")
            from wyoming.error import Error

            with contextlib.suppress(ConnectionError):
                await self.write(Error(text="the server failed (its log has the details)", code="internal_error"))
        finally:
            for job in self.jobs:
                job.cancel.set()
            self.writer.close()

    async def handle(self, event: Any) -> None:
        from wyoming.error import Error
        from wyoming.info import Describe
        from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

        try:
            if Describe.is_type(event.type):
                await self.write(describe(self.service))
            elif SynthesizeStart.is_type(event.type):
                start = SynthesizeStart.from_event(event)
                self.streaming = {"voice": start.voice, "text": "", "seed": self.config.seed, "started": False}
            elif SynthesizeChunk.is_type(event.type) and self.streaming is not None:
                self.streaming["text"] += SynthesizeChunk.from_event(event).text
                await self.speak_sentences(final=False)
            elif SynthesizeStop.is_type(event.type) and self.streaming is not None:
                await self.speak_sentences(final=True)
                await self.finish_stream()
                self.streaming = None
                await self.write(SynthesizeStopped())
            elif Synthesize.is_type(event.type) and self.streaming is None:  # else: sent for old servers, ignored
                request = Synthesize.from_event(event)
                await self.speak(request.text, request.voice, self.config.seed, start=True, stop=True)
        except Refused as exc:
            self.streaming = None  # a refused stream ends here: its later chunks are ignored
            await self.write(Error(text=exc.message, code=exc.code))

    async def speak_sentences(self, final: bool) -> None:
        """Speak the streamed text's completed sentences (all of it when `final`)."""
        stream = self.streaming
        ends = [match.end() for match in SENTENCE_END.finditer(stream["text"])]
        cut = len(stream["text"]) if final else (ends[-1] if ends else 0)
        ready, stream["text"] = stream["text"][:cut], stream["text"][cut:]
        if ready.strip():
            stream["seed"] = await self.speak(ready.strip(), stream["voice"], stream["seed"],
                                              start=not stream["started"], stop=False)
            stream["started"] = True

    async def finish_stream(self) -> None:
        """AudioStop for a stream that sent audio (an AudioStart and AudioStop when it sent none)."""
        from wyoming.audio import AudioStart, AudioStop

        if not self.streaming["started"]:
            await self.write(AudioStart(rate=self.service.sample_rate, width=SAMPLE_WIDTH, channels=1))
        await self.write(AudioStop())

    async def speak(self, text: str, voice: Any, seed: int | None, start: bool, stop: bool) -> int:
        """Synthesize `text` and send its audio as it is decoded -> the seed used. Refused (no
        audio sent) for what the HTTP server answers 4xx/5xx."""
        from wyoming.audio import AudioChunk, AudioStart, AudioStop

        name = (voice.name if voice is not None else None) or self.config.voice
        language = voice.language if voice is not None and voice.name is None else None
        if len(text) > server_service.MAX_INPUT_CHARS:
            raise Refused(f"text is longer than {server_service.MAX_INPUT_CHARS} characters; send it in several "
                          "requests",
                          "string_above_max_length")
        loop = asyncio.get_running_loop()
        speech = server_service.Speech(input=text, voice=name, language=language, seed=seed)
        try:
            job = server_service.plan_job(self.service, speech, loop, stream=True)
            self.service.pool.submit(job)
        except server_pool.ApiError as exc:
            raise Refused(exc.message, exc.code) from None
        except server_pool.QueueFull:
            raise Refused("the server is busy; retry in a moment", "queue_full") from None
        except server_pool.Draining:
            raise Refused("the server is shutting down", "shutting_down") from None
        LOG.info("synthesize: %d characters, voice %s, seed %d", len(text), name, job.request.seed)
        self.jobs.append(job)
        timer = loop.call_at(loop.time() + self.service.config.timeout_s, server_pool.time_out, job)
        rate = self.service.sample_rate
        try:
            if start:
                await self.write(AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=1))
            while True:
                kind, payload = await job.events.get()
                if kind == "chunk":
                    await self.write(AudioChunk(rate=rate, width=SAMPLE_WIDTH, channels=1,
                                                audio=to_pcm16(payload).tobytes()))
                elif kind == "done":
                    break
                else:
                    failure = server_pool.job_failure(job, kind, payload)
                    raise Refused(failure.message, failure.code)
            if stop:
                await self.write(AudioStop())
        finally:
            timer.cancel()
            job.cancel.set()  # a no-op once done; stops the worker if this ended early
            self.jobs.remove(job)
        return job.request.seed


def announced_address(host: str) -> str:
    """The address to announce for a server bound to `host`: itself, or for a wildcard bind the
    address of the interface multicast leaves by (as the wyoming package finds it)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((MDNS_GROUP, 1))
        return probe.getsockname()[0]


async def announce(name: str, host: str, port: int) -> Any:
    """Register `name` as a _wyoming._tcp service at host:port over mDNS -> (the AsyncZeroconf,
    its service info) to unregister at stop; a UserError when it cannot be announced."""
    from zeroconf import Error as ZeroconfError
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    try:
        address = announced_address(host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        info = AsyncServiceInfo(ZEROCONF_TYPE, f"{name}.{ZEROCONF_TYPE}", port=port,
                                addresses=[socket.inet_pton(family, address)],
                                properties={"version": __version__})
        zeroconf = AsyncZeroconf(ip_version=IPVersion.V6Only if family == socket.AF_INET6 else IPVersion.V4Only)
        await zeroconf.async_register_service(info)
    except (OSError, ValueError, ZeroconfError) as exc:  # no multicast route; a name mDNS cannot carry
        raise UserError(f"--zeroconf: cannot announce {name!r} over mDNS ({exc})",
                        "check the network allows multicast, or leave out --zeroconf") from None
    if ipaddress.ip_address(address).is_loopback:
        LOG.warning("--zeroconf announces %s, a loopback address other machines cannot reach; bind --uri to this "
                    "machine's address for Home Assistant to find it", address)
    LOG.info("zeroconf: announced %s at %s:%d", info.name, address, port)
    return zeroconf, info


async def serve_async(service: server_service.Service, config: WyomingConfig, listener: socket.socket) -> None:
    """Accept connections on `listener` until SIGTERM/SIGINT, then cancel what runs and return."""
    sessions: set[Session] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(service, config, reader, writer)
        sessions.add(session)
        try:
            await session.run()
        finally:
            sessions.discard(session)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listening = await asyncio.start_server(connected, sock=listener)
    bound_host, bound_port = listener.getsockname()[:2]
    LOG.info("omnivoice-onnx wyoming: %d voice(s), %d language(s); seed %s", len(voice_names(service)),
             len(service.languages()), "per request" if config.seed is None else config.seed)
    LOG.info("%s%s", LISTENING, f"tcp://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}")
    announced = await announce(config.zeroconf, bound_host, bound_port) if config.zeroconf else None
    async with listening:
        await stop.wait()
        if announced is not None:  # gone from Home Assistant's list before the port closes
            await announced[0].async_unregister_service(announced[1])
            await announced[0].async_close()
        LOG.info("stopping: cancelling %d connection(s)", len(sessions))
        listening.close()
        for session in list(sessions):
            for job in session.jobs:
                job.cancel.set()
            session.writer.close()
    with contextlib.suppress(Exception):
        await listening.wait_closed()


def listen(config: WyomingConfig) -> socket.socket:
    """The listening socket of --uri: a bad URI or a busy port is named before any model loads."""
    return server_service.bind(*parse_uri(config.uri))


def serve(service: server_service.Service, config: WyomingConfig, listener: socket.socket) -> int:
    """Run the Wyoming server on `listener` with the loaded `service` (server.load_service: the
    command line loads it, so this module stands below the HTTP server) until SIGTERM/SIGINT; 0."""
    try:
        if config.voice not in voice_names(service):
            raise UserError(f"--voice {config.voice} is not one of this server's voices",
                            f"choose one of {', '.join(voice_names(service))}")
        asyncio.run(serve_async(service, config, listener))
    finally:
        service.pool.close()
    return 0
