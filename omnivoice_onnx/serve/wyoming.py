"""A Wyoming server over the torch-free runtime (`omnivoice-onnx wyoming`), for Home Assistant.

    pip install 'omnivoice-onnx[wyoming]'
    omnivoice-onnx wyoming --model-dir onnx --uri tcp://127.0.0.1:10200

Home Assistant's local voice pipeline speaks Wyoming (https://github.com/OHF-Voice/wyoming), not
HTTP: add this server as its "Wyoming Protocol" integration (host, port). Events (the `wyoming`
package's own classes):
- Describe -> Info: one TtsProgram "omnivoice-onnx" whose voices are the reference voices of
  --ref-dir (omnivoice_onnx.serve.wyoming_voices), the saved voices, the OpenAI-named presets
  (omnivoice_onnx.voices) and "auto" ("design" needs a description the protocol cannot send),
  each described by its name and a few words, with the languages Home Assistant can name (the
  model's two-letter ids, ar, or, yue: about 130 of its 646); a request's language may be any
  name, id or tag the runtime resolves (eng, en-US).
- Synthesize(text, voice) -> AudioStart, AudioChunk... (16-bit mono PCM at 24 kHz, sent as
  OmniVoiceOnnx.stream() decodes each sentence-sized chunk, in pieces of at most
  AUDIO_CHUNK_BYTES), AudioStop. `text_format: ssml` is spoken as its text (serve.ssml).
- SynthesizeStart, SynthesizeChunk..., SynthesizeStop (streamed text, wyoming >= 1.7): each
  completed sentence is spoken as soon as it arrives, inside one AudioStart..AudioStop, then
  SynthesizeStopped. A Synthesize sent alongside (clients do, for older servers) is ignored.
- A refused request -> Error(text, code): the front door's (omnivoice_onnx.serve.door) message
  and code, the same an HTTP client gets for the same request; then the connection ends, as
  wyoming-piper ends it (a proxy waiting for AudioStop or the end of the connection learns at once).

What comes off the network is read by omnivoice_onnx.serve.wyoming_events (its own reader: every
size and time bounded, so that nothing a peer sends ends in a traceback or holds the server); a
connection with no event in flight is closed after door.IDLE_TIMEOUT_S; at most
door.MAX_CONNECTIONS are open. A peer not speaking the protocol, or sending an event with a bad
field (text that is not a string, a voice that is not an object), gets one Error event and the
connection is closed. Streamed text is held only up to door.MAX_INPUT_CHARS without a sentence
end, and scanned for sentence ends once per character.

Requests then go through the HTTP server's machinery (service.plan_job): the same voice
resolution, limits, the runtime's one validation, queue and timeout. The protocol carries no
seed and no speed: each request gets the voice's seed (a preset's, a saved or reference voice's),
else a fresh one, and the log line names it; --seed N fixes it for every request (then the audio
equals stream(text, seed=N) of the voice, bit for bit as 16-bit PCM), --speed every request's
rate. A streamed request keeps the seed of its first sentence for the rest. With random weights
(test bundles) every voice speaks noise.
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
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omnivoice_onnx.audio_formats import to_pcm16
from omnivoice_onnx.core.prompt import advertised_languages
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.serve import door
from omnivoice_onnx.serve import service as server_service
from omnivoice_onnx.serve.door import ApiError, refuse
from omnivoice_onnx.serve.pool import Job, job_failure, time_out
from omnivoice_onnx.serve.ssml import TEXT_FORMATS, SsmlText, spoken_text
from omnivoice_onnx.serve.wyoming_events import Idle, Incoming, Unframed, read_event
from omnivoice_onnx.serve.wyoming_voices import AUTO_DESCRIPTION, RefVoice, info, label, scan_ref_dir
from omnivoice_onnx.version import __version__

LOG = logging.getLogger("omnivoice_onnx.wyoming")

DEFAULT_URI = "tcp://127.0.0.1:10200"  # wyoming-piper's port is 10200 too; one of them per machine
DEFAULT_VOICE = "alloy"  # the voice of a request that names none
LISTENING = "omnivoice-onnx wyoming: listening on "  # the start line's prefix (serving.launch reads it)
SAMPLE_WIDTH = 2  # bytes per sample: 16-bit PCM, what Home Assistant plays
# The most audio one AudioChunk carries: half the most an event may carry into this server
# (door.MAX_BODY_BYTES, data and payload), so the event, its data included, is one any Wyoming
# reader built as ours takes (wyoming-piper sends 2 KiB; a sentence of 4 s is 192 KB of PCM).
AUDIO_CHUNK_BYTES = door.MAX_BODY_BYTES // 2
LINGER_S = 1.0  # how long a refused peer's remaining bytes are read and dropped before the close
# mDNS discovery as wyoming-piper does it (the wyoming package's zeroconf module): Home Assistant
# browses this type and offers each server it finds under its name.
ZEROCONF_TYPE = "_wyoming._tcp.local."
ZEROCONF_NAME = "omnivoice-onnx"  # --zeroconf without a name
MAX_ZEROCONF_BYTES = 63  # a DNS-SD service instance name is one DNS label (RFC 6763 4.1.1)
MDNS_GROUP = "224.0.0.251"  # a UDP socket "connected" here names the interface mDNS leaves by (sends nothing)
# A sentence is complete once its end mark (and any closing quote or bracket) is followed by
# whitespace: "Dr. Smith" may still split early, which costs a pause, never words.
END_MARKS = ".!?;:\u3002\uff01\uff1f\uff1b"
CLOSERS = "\"')]\u201d\u2019\u300d"
SENTENCE_END = re.compile(f"[{re.escape(END_MARKS)}][{re.escape(CLOSERS)}]*\\s")


@dataclass
class WyomingConfig:
    """What `omnivoice-onnx wyoming` was asked for, beyond the HTTP server's loading options."""

    uri: str = DEFAULT_URI
    seed: int | None = None  # every request's seed (None: the preset's, else a fresh one, logged)
    voice: str = DEFAULT_VOICE
    allow_remote: bool = False  # --allow-remote: listen where other machines reach it (the protocol has no key)
    zeroconf: str | None = None  # the service name announced over mDNS (None: not announced)
    speed: float | None = None  # every request's speaking rate (the protocol carries none; None: 1.0)
    sentence_silence: float | None = None  # every request's pause between chunks (None: none)
    volume: float | None = None  # every request's linear gain (None: unchanged)
    ref_dir: Path | None = None  # --ref-dir: a folder of reference voices (wyoming_voices)


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


def voice_entries(service: server_service.Service, hidden: set[str]) -> list[server_service.VoiceEntry]:
    """The service's voices a Wyoming client may pick: saved, presets, then auto ("design" needs a
    description, which the protocol cannot send); those a reference voice's name hides left out."""
    catalogue = [entry for entry in service.voice_catalogue() if entry.name.casefold() not in hidden]
    return [entry for entry in catalogue if entry.kind != "builtin"] + [
        entry for entry in catalogue if entry.kind == "builtin" and entry.name == "auto"
    ]


def voice_names(service: server_service.Service, refs: dict[str, RefVoice]) -> list[str]:
    """Every voice name a request may give, as an error lists them: the reference voices, then the
    rest in the HTTP server's order (Service.voice_names), so both doors refuse a name alike."""
    hidden = {ref.name.casefold() for ref in refs.values()}
    listed = [entry.name for entry in voice_entries(service, hidden)]
    return [ref.name for ref in refs.values()] + [name for name in service.voice_names() if name in listed]


def entry_label(entry: server_service.VoiceEntry) -> str:
    """A service voice's label in Info: auto says what it does, a clone that it is one, a designed
    voice its description (wyoming_voices.label cuts it to what Home Assistant shows)."""
    kinds = {"builtin": AUTO_DESCRIPTION, "clone": "cloned voice"}
    return label(entry.name, kinds.get(entry.kind) or entry.text or "designed voice")


def describe(service: server_service.Service, refs: dict[str, RefVoice]) -> Any:
    """The Info event: the reference voices, each with its language, then the service's, each with
    the languages Home Assistant can name (prompt.advertised_languages; a request may still name
    any of the model's), each labelled for Home Assistant's picker (wyoming_voices.label)."""
    languages = advertised_languages(service.tts.runtime_config["languages"])
    return info(
        [(ref.name, label(ref.name, ref.description), [ref.language]) for ref in refs.values()]
        + [(entry.name, entry_label(entry), languages) for entry in voice_entries(service, set(refs))]
    )


def voice_of(data: dict[str, Any]) -> tuple[str | None, str | None]:
    """(name, language) of an event's `voice` object (each None when absent)."""
    voice = door.typed(data, "voice", dict) or {}
    return door.typed(voice, "name", str), door.typed(voice, "language", str)


def ssml_of(data: dict[str, Any]) -> SsmlText | None:
    """The SSML reader of a Synthesize(Start) whose `text_format` is "ssml" (None: plain text)."""
    text_format = door.typed(data, "text_format", str)
    if text_format not in (None, *TEXT_FORMATS):
        raise refuse("invalid_value", detail=f"text_format {text_format!r:.40} is neither {' nor '.join(TEXT_FORMATS)}")
    return SsmlText() if text_format == "ssml" else None


def resume_at(text: str) -> int:
    """Where a sentence end that the next chunk completes could begin: before the trailing run
    of end marks and closers (the only part of `text` a new chunk can change a match in)."""
    at = len(text)
    while at > 0 and text[at - 1] in END_MARKS + CLOSERS:
        at -= 1
    return at


@dataclass
class Stream:
    """A streamed synthesis between SynthesizeStart and SynthesizeStop."""

    voice: tuple[str | None, str | None]
    seed: int | None
    ssml: SsmlText | None  # text_format ssml: each chunk is read through it
    text: str = ""  # received, not yet spoken
    markup: int = 0  # SSML characters received since a sentence was last spoken (bounded)
    scanned: int = 0  # text[:scanned] holds no sentence end (scanned once)
    started: bool = False  # its AudioStart was sent


class Session:
    """One client connection: its events in, audio and errors out."""

    def __init__(
        self,
        service: server_service.Service,
        config: WyomingConfig,
        refs: dict[str, RefVoice],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.service, self.config, self.refs, self.reader, self.writer = service, config, refs, reader, writer
        self.peer = writer.get_extra_info("peername")
        self.stream: Stream | None = None
        self.jobs: list[Job] = []  # running, cancelled if the connection or the server ends
        self.busy = False  # an event is being answered (the drain lets it finish)
        self.draining = False

    async def write(self, event: Any) -> None:
        from wyoming.event import async_write_event

        await async_write_event(event.event(), self.writer)

    async def refuse(self, error: ApiError) -> None:
        """The Error event of a refusal, and its log line (never a traceback)."""
        from wyoming.error import Error

        LOG.info("wyoming %s: refused (%s): %s", self.peer, error.code, error.message)
        await self.write(Error(text=error.message, code=error.code))

    async def run(self) -> None:
        try:
            while not self.draining:
                try:
                    event = await read_event(self.reader)
                except Unframed as exc:
                    await self.refuse(exc.error)
                    await self.linger()
                    break
                except Idle:  # a stream left open is told why its AudioStop never comes
                    if self.stream is not None:
                        await self.refuse(refuse("idle_timeout", seconds=door.IDLE_TIMEOUT_S))
                    break
                if event is None:
                    break
                self.busy = True
                try:
                    going_on = await self.handle(event)
                finally:
                    self.busy = False
                if not going_on:  # a refused request ends the connection, as wyoming-piper's does
                    await self.linger()
                    break
            if self.draining:
                await self.last_word()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: its work is cancelled below
        except Exception:  # a bug: logged with its traceback; the client gets one line, the server goes on
            LOG.exception("wyoming request failed")
            with contextlib.suppress(ConnectionError):
                await self.refuse(refuse("internal_error"))
        finally:
            for job in self.jobs:
                job.cancel.set()
            self.writer.close()

    async def linger(self) -> None:
        """Before closing on a peer whose bytes are still coming: say we are done writing, then
        read and drop what it sends for a moment (bounded), so that the close does not reset the
        connection and destroy the Error event just sent."""
        if self.writer.can_write_eof():
            self.writer.write_eof()
        deadline = asyncio.get_running_loop().time() + LINGER_S
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            while await asyncio.wait_for(
                self.reader.read(door.MAX_BODY_BYTES), max(0.0, deadline - asyncio.get_running_loop().time())
            ):
                pass

    async def last_word(self) -> None:
        """The drain's end for this connection: a stream still open gets `shutting_down` (its
        client would otherwise wait for an AudioStop that never comes); an idle one is just closed."""
        if self.stream is not None:
            self.stream = None
            await self.refuse(refuse("shutting_down"))

    async def handle(self, event: Incoming) -> bool:
        """Answer one event -> whether the connection goes on: a refusal (an Error event) ends it,
        so that a client waiting for AudioStop or the end of the connection (a proxy) learns at
        once that none comes, and a client that reads on gets the end of the connection."""
        from wyoming.tts import SynthesizeStopped

        try:
            if event.type == "describe":
                await self.write(describe(self.service, self.refs))
            elif event.type == "synthesize-start":
                self.stream = Stream(voice_of(event.data), self.config.seed, ssml_of(event.data))
            elif event.type == "synthesize-chunk" and self.stream is not None:
                await self.hear(self.stream, door.typed(event.data, "text", str, required=True))
            elif event.type == "synthesize-stop" and self.stream is not None:
                await self.speak_sentences(self.stream, final=True)
                await self.finish_stream(self.stream)
                self.stream = None
                await self.write(SynthesizeStopped())
            elif event.type == "synthesize" and self.stream is None:  # else: sent for old servers, ignored
                text = door.text_field(event.data, "text")
                ssml = ssml_of(event.data)
                text = text if ssml is None else spoken_text(text)
                await self.speak(text, voice_of(event.data), self.config.seed, start=True, stop=True)
        except ApiError as exc:
            self.stream = None
            await self.refuse(exc)
            return False
        return True

    async def hear(self, stream: Stream, chunk: str) -> None:
        """A streamed chunk: held until its sentence ends (at most door.MAX_INPUT_CHARS held; SSML's
        markup around them at most door.MAX_BODY_BYTES characters)."""
        if stream.ssml is not None:
            stream.markup += len(chunk)
            chunk = stream.ssml.feed(chunk)
        stream.text += chunk
        await self.speak_sentences(stream, final=False)
        if len(stream.text) > door.MAX_INPUT_CHARS or stream.markup > door.MAX_BODY_BYTES:
            raise door.too_long(
                "streamed text without a sentence end", fix="end a sentence (. ! ? and a space) before that"
            )

    async def speak_sentences(self, stream: Stream, final: bool) -> None:
        """Speak the streamed text's completed sentences (all of it when `final`); the text is
        scanned from where the last scan left off."""
        if final and stream.ssml is not None:
            stream.text += stream.ssml.feed("", final=True)  # a document left unclosed is refused here
        ends = [match.end() for match in SENTENCE_END.finditer(stream.text, stream.scanned)]
        cut = len(stream.text) if final else (ends[-1] if ends else 0)
        ready, stream.text = stream.text[:cut], stream.text[cut:]
        stream.scanned = resume_at(stream.text)
        spoken = ready.strip() if stream.ssml is None else " ".join(ready.split())
        if spoken:
            stream.seed = await self.speak(spoken, stream.voice, stream.seed, start=not stream.started, stop=False)
            stream.started, stream.markup = True, 0

    async def finish_stream(self, stream: Stream) -> None:
        """AudioStop for a stream that sent audio (an AudioStart and AudioStop when it sent none)."""
        from wyoming.audio import AudioStart, AudioStop

        if not stream.started:
            await self.write(AudioStart(rate=self.service.sample_rate, width=SAMPLE_WIDTH, channels=1))
        await self.write(AudioStop())

    def speech(
        self, text: str, voice: tuple[str | None, str | None], seed: int | None
    ) -> tuple[str, server_service.Speech]:
        """(the voice's name, the synthesis) of a request: a reference voice (wyoming_voices) speaks
        in its folder's language, with its seed unless --seed; any other voice is one of Info's
        (a name in any case), else the request is refused naming them; the language a request
        gives applies to a voice it does not name (a named one speaks as it is)."""
        name, language = voice
        language = language if name is None else None
        name = name or self.config.voice
        ref = self.refs.get(name.casefold())
        if ref is not None:
            return ref.name, server_service.Speech(
                input=text,
                voice=ref.name if ref.prompt is not None else "auto",  # a clone: service.references holds it
                instructions=ref.instruct,
                language=ref.language,
                speed=self.config.speed,
                sentence_silence=self.config.sentence_silence,
                volume=self.config.volume,
                seed=ref.seed if seed is None else seed,
            )
        names = voice_names(self.service, self.refs)
        if name.casefold() not in {known.casefold() for known in names}:
            raise refuse("invalid_voice", "voice", detail=f"unknown voice {name!r:.80}; voices: {', '.join(names)}")
        return name, server_service.Speech(
            input=text,
            voice=name,
            language=language,
            speed=self.config.speed,
            sentence_silence=self.config.sentence_silence,
            volume=self.config.volume,
            seed=seed,
        )

    async def speak(
        self, text: str, voice: tuple[str | None, str | None], seed: int | None, start: bool, stop: bool
    ) -> int:
        """Synthesize `text` and send its audio as it is decoded -> the seed used. ApiError (no
        audio sent) for what the HTTP server answers 4xx/5xx."""
        from wyoming.audio import AudioChunk, AudioStart, AudioStop

        if len(text) > door.MAX_INPUT_CHARS:
            raise door.too_long("text")
        name, speech = self.speech(text, voice, seed)
        loop = asyncio.get_running_loop()
        job = server_service.plan_job(self.service, speech, loop, stream=True)
        self.service.pool.submit(job)
        LOG.info("synthesize: %d characters, voice %s, seed %d", len(text), name, job.request.seed)
        self.jobs.append(job)
        timer = loop.call_at(loop.time() + self.service.config.timeout_s, time_out, job)
        rate = self.service.sample_rate
        try:
            if start:
                await self.write(AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=1))
            while True:
                kind, payload = await job.events.get()
                if kind == "chunk":  # a decoded chunk, sent in pieces of at most AUDIO_CHUNK_BYTES
                    pcm = to_pcm16(payload).tobytes()
                    for at in range(0, len(pcm), AUDIO_CHUNK_BYTES):
                        await self.write(
                            AudioChunk(
                                rate=rate, width=SAMPLE_WIDTH, channels=1, audio=pcm[at : at + AUDIO_CHUNK_BYTES]
                            )
                        )
                elif kind == "done":
                    break
                else:
                    raise job_failure(job, kind, payload, self.service.pool.draining)
            if stop:
                await self.write(AudioStop())
        finally:
            timer.cancel()
            job.cancel.set()  # a no-op once done; stops the worker if this ended early
            self.jobs.remove(job)
        return job.request.seed


# --- the server ----------------------------------------------------------------------------------


def announced_address(host: str) -> str:
    """The address to announce for a server bound to `host`: itself, or for a wildcard bind the
    address of the interface multicast leaves by (as the wyoming package finds it)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((MDNS_GROUP, 1))
        address: str = probe.getsockname()[0]  # an (address, port) pair for AF_INET
        return address


def check_zeroconf_name(name: str) -> str:
    """A --zeroconf NAME: the service instance name Home Assistant lists, one DNS-SD label (1-63
    bytes of UTF-8, printable). An empty one would announce nothing, and say nothing."""
    if not name.strip() or not name.isprintable() or len(name.encode("utf-8")) > MAX_ZEROCONF_BYTES:
        raise ValueError(
            f"--zeroconf {name!r:.80} is not a service name: 1-{MAX_ZEROCONF_BYTES} bytes of printable text "
            f"(or --zeroconf alone: {ZEROCONF_NAME})"
        )
    return name


async def announce(name: str, host: str, port: int) -> Any:
    """Register `name` as a _wyoming._tcp service at host:port over mDNS -> (the AsyncZeroconf,
    its service info) to unregister at stop; a UserError when it cannot be announced."""
    from zeroconf import Error as ZeroconfError
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    try:
        address = announced_address(host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        info = AsyncServiceInfo(
            ZEROCONF_TYPE,
            f"{name}.{ZEROCONF_TYPE}",
            port=port,
            addresses=[socket.inet_pton(family, address)],
            properties={"version": __version__},
        )
        zeroconf = AsyncZeroconf(ip_version=IPVersion.V6Only if family == socket.AF_INET6 else IPVersion.V4Only)
        await zeroconf.async_register_service(info)
    except (OSError, ValueError, ZeroconfError) as exc:  # no multicast route; a name mDNS cannot carry
        raise UserError(
            f"--zeroconf: cannot announce {name!r} over mDNS ({exc})",
            "check the network allows multicast, or leave out --zeroconf",
        ) from None
    if ipaddress.ip_address(address).is_loopback:
        LOG.warning(
            "--zeroconf announces %s, a loopback address other machines cannot reach; bind --uri to this "
            "machine's address for Home Assistant to find it",
            address,
        )
    LOG.info("zeroconf: announced %s at %s:%d", info.name, address, port)
    return zeroconf, info


async def serve_async(
    service: server_service.Service, config: WyomingConfig, refs: dict[str, RefVoice], listener: socket.socket
) -> int:
    """Accept connections on `listener` until SIGTERM/SIGINT, then drain -> the signal (0: none)."""
    sessions: dict[Session, asyncio.Task[None]] = {}

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(service, config, refs, reader, writer)
        if len(sessions) >= door.MAX_CONNECTIONS:
            with contextlib.suppress(ConnectionError):
                await session.refuse(refuse("too_many_connections", limit=door.MAX_CONNECTIONS))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None, "start_server runs each connection's callback in a task"
        sessions[session] = task
        try:
            await session.run()
        finally:
            sessions.pop(session, None)

    stopped_by: list[int] = []
    stop = asyncio.Event()

    def stopping(sig: int) -> None:
        stopped_by.append(sig)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)
    listening = await asyncio.start_server(connected, sock=listener, limit=door.MAX_HEADER_BYTES)
    bound_host, bound_port = listener.getsockname()[:2]
    LOG.info(
        "omnivoice-onnx wyoming: %d voice(s) (%d from --ref-dir); %d language codes advertised to Home "
        "Assistant, a request may name any of the model's %d languages; seed %s; speed %s",
        len(voice_names(service, refs)),
        len(refs),
        len(advertised_languages(service.tts.runtime_config["languages"])),
        len(service.languages()),
        "per request" if config.seed is None else config.seed,
        "1.0" if config.speed is None else f"{config.speed:g}",
    )
    LOG.info("%s%s", LISTENING, f"tcp://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}")
    if not server_service.is_loopback(bound_host):  # listen() let it through: --allow-remote
        LOG.warning(  # here, once every check passed: a refusal is one message, never after this one
            "--allow-remote: serving Wyoming on %s WITHOUT AUTHENTICATION (the protocol has none); anyone "
            "who can reach this address can use it",
            bound_host,
        )
    announced = await announce(config.zeroconf, bound_host, bound_port) if config.zeroconf is not None else None
    async with listening:
        await stop.wait()
        if announced is not None:  # gone from Home Assistant's list before the port closes
            await announced[0].async_unregister_service(announced[1])
            await announced[0].async_close()
        listening.close()
        await drain(service, sessions)
    return stopped_by[0] if stopped_by else 0


async def drain(service: server_service.Service, sessions: dict[Session, asyncio.Task[None]]) -> None:
    """SIGTERM: no new requests (the pool refuses them: shutting_down); every connection ends with
    a final event. Idle ones are closed (a stream still open gets its Error); one being answered
    finishes (its AudioStop) within the drain timeout, else its job is cancelled and it gets
    `shutting_down`. What still hangs after that (a client that reads nothing) is cancelled."""
    service.pool.draining = True
    LOG.info("stopping: draining %d connection(s) (up to %g s)", len(sessions), service.config.drain_s)
    for session in list(sessions):
        session.draining = True
        if not session.busy:
            with contextlib.suppress(ConnectionError):
                await session.last_word()
            session.writer.close()  # its read ends; run() returns
    tasks = set(sessions.values())
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=service.config.drain_s)
        if late:
            LOG.warning("drain timeout: cancelling %d request(s)", len(late))
            for session in list(sessions):
                for job in session.jobs:
                    job.cancel.set()
            _, late = await asyncio.wait(late, timeout=door.HEADER_TIMEOUT_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


def listen(config: WyomingConfig) -> socket.socket:
    """The listening socket of --uri: a bad URI, a busy port or an address other machines reach
    without --allow-remote is named before any model loads (the protocol has no key: anyone who
    can reach the port can use it, as `serve --no-auth`; serve_async warns so once listening)."""
    host, port = parse_uri(config.uri)
    if not server_service.is_loopback(host) and not config.allow_remote:
        raise UserError(
            f"refusing to serve Wyoming on {host}: the protocol has no key, so anyone who can reach it could use it",
            "bind --uri tcp://127.0.0.1:PORT, or pass --allow-remote to serve a trusted network on purpose",
        )
    return server_service.bind(host, port)


def serve(service: server_service.Service, config: WyomingConfig, listener: socket.socket) -> int:
    """Run the Wyoming server on `listener` with the loaded `service` (service.load_service) until
    SIGTERM/SIGINT -> 0 when the drain let every request finish, else 128 + the signal (as `serve`)."""
    try:
        refs = {} if config.ref_dir is None else scan_ref_dir(config.ref_dir, service.tts)
        for ref in refs.values():
            if ref.prompt is not None:  # resolved by name before saved voices (Service.voice_kwargs)
                service.references[ref.name] = ref.prompt
        names = voice_names(service, refs)
        if config.voice.casefold() not in {name.casefold() for name in names}:
            raise UserError(
                f"--voice {config.voice} is not one of this server's voices", f"choose one of {', '.join(names)}"
            )
        stopped_by = asyncio.run(serve_async(service, config, refs, listener))
    finally:
        service.pool.close()
    return 128 + stopped_by if stopped_by and service.pool.cut_off else 0
