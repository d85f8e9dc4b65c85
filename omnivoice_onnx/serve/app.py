"""An OpenAI-compatible speech server over the torch-free runtime (`omnivoice-onnx serve`).

    pip install 'omnivoice-onnx[serve]'
    omnivoice-onnx serve --model-dir onnx --port 8000          # 127.0.0.1 unless --host says otherwise

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.audio.speech.create(model="omnivoice", voice="auto", input="Hello.").write_to_file("hello.wav")

Routes (OpenAI's shapes, so the official client and the tools built on it work unchanged):
    POST /v1/audio/speech   model, input, voice, instructions, response_format, speed, stream_format,
                            and the extensions stream, language, seed, num_step, guidance_scale,
                            duration, strict_instructions; applied/ignored prose instructions in X-Instructions-*
    POST /v1/audio/speech/clone  multipart: input, ref_audio (a file), ref_text and the speech fields
    POST /v1/audio/script   lines [{voice, text}] -> one audio file, joined by `pause` s of silence
    GET  /v1/audio/voices   auto, the saved voices and the OpenAI-named presets no saved voice
                            replaces (omnivoice_onnx.voices; "design" is left out: it needs instructions):
                            `voices` [{"id", "name"}] as Open WebUI reads it, `data` in full
    GET  /v1/audio/voices/{name}  one of them (names in any case)
    POST /v1/audio/voices   multipart: name, ref_audio + ref_text or instruct, seed -> a saved voice;
    PATCH, DELETE /v1/audio/voices/{name}  rename ({"name"}) or delete one: all three only with
                            --allow-voice-save (else 403)
    GET  /v1/models         the bundle's model id, the transformer variants in the folder, and the
                            ids that name the served variant (tts-1, tts-1-hd, gpt-4o-mini-tts, --model-alias)
    GET  /v1/models/{id}    one of them, as OpenAI's; GET /v1/audio/models: the served ones, as Open
                            WebUI reads them ({"models": [{"id"}]})
    GET  /v1/audio/languages  the model's language ids and names (extension)
    POST /v1/audio/references  a reference recording as the body, ?ref_text=its words -> a voice id
                            for later requests ("ref-...", in memory); &save_as=NAME saves it as a
                            voice, only with --allow-voice-save (else 403)
    GET  /                  a page to try voices (omnivoice_onnx/serve/web/index.html; no key needed)
    GET  /health            liveness and queue depth (no key needed: for load balancers)
    GET  /metrics           Prometheus' text format (omnivoice_onnx.serve.metrics)

OpenAI clients work with OpenAI's defaults: `model="tts-1"` and `voice="alloy"` (a preset: a
voice-design instruct and a fixed seed, so the same request gives the same bytes); see
docs/drop-in.md.

What a request gets (docs/serving.md says it for users): a stream, as OpenAI answers
(OmniVoiceOnnx.stream()'s chunks, encoded as each is decoded: the first bytes after the first
sentence-sized chunk), or with `"stream": false` / --no-stream the whole clip of
OmniVoiceOnnx.generate() with its Content-Length (a seed then gives generate()'s audio exactly);
FLAC always whole (libsndfile rewrites its header at close). The seed used is in `X-Seed`. Errors
in OpenAI's shape, every one from the front door's table (door.ERRORS, which Wyoming answers from
too); no traceback or server path reaches a client.

Concurrency (serve.pool): a bounded queue in front of N worker threads, each with its own
OmniVoiceOnnx; a client that disconnects, or a request past --timeout, is cancelled between
unmasking steps. SIGTERM (or Ctrl-C) lets the requests in flight finish (up to --drain-timeout)
and exits 0, a drained stop being a server's successful end; 143 (130) only when the drain timeout
cut requests off.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from omnivoice_onnx import voices as voice_store
from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.audio_formats import StreamEncoder, available_response_formats, encode_audio
from omnivoice_onnx.core.instruct import resolve_instruct
from omnivoice_onnx.core.request import keywords
from omnivoice_onnx.core.shapes import VoiceClonePrompt
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.serve import door, forms
from omnivoice_onnx.serve.browser import BrowserGuard, BrowserPolicy
from omnivoice_onnx.serve.connection import http_protocol, make_server, read_body, spooled_body
from omnivoice_onnx.serve.door import ApiError, refuse
from omnivoice_onnx.serve.forms import form_text, form_upload, form_value, instruction_headers, read_form, voice_item
from omnivoice_onnx.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from omnivoice_onnx.serve.metrics import Metrics
from omnivoice_onnx.serve.middleware import Measured, RequireKey, add_error_handlers, route_templates
from omnivoice_onnx.serve.page import add_page_routes, random_weights
from omnivoice_onnx.serve.pool import Job, WorkerPool, time_out
from omnivoice_onnx.serve.script import script_request_model
from omnivoice_onnx.serve.service import (
    MODEL_ID,
    ServerConfig,
    Service,
    Speech,
    VoiceEntry,
    bind,
    build_job,
    check_auth,
    check_model,
    is_loopback,
    plan_job,
    response_format,
    speech_request_model,
    streams,
    validation_error,
)
from omnivoice_onnx.serve.streaming import (
    LastWord,
    StreamFailed,
    first_or_failure,
    sse_events,
    stream_bytes,
    task_result,
)
from omnivoice_onnx.sessions import worker_threads

if TYPE_CHECKING:  # the serve extra's packages, imported where the app is built
    from fastapi import FastAPI
    from pydantic import BaseModel

LOG = logging.getLogger("omnivoice_onnx.server")
LISTENING = "omnivoice-onnx serve: listening on "  # the start line's prefix, read by launch()


def create_app(service: Service) -> FastAPI:
    """The FastAPI application over `service` (its WorkerPool is closed when the app shuts down):
    the error handlers, the middleware, then each group of routes. A new group is one more
    add_*_routes(app, service) here."""
    from fastapi import FastAPI

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.pool.close)

    # No generated schema or docs pages (GET /openapi.json is a JSON 404): the routes are OpenAI's.
    app = FastAPI(
        title="omnivoice-onnx", description=__doc__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    add_error_handlers(app)
    add_middleware(app, service)
    add_info_routes(app, service)
    add_page_routes(app)
    add_voice_routes(app, service)
    add_reference_routes(app, service)
    add_speech_routes(app, service)
    return app


def browser_policy(config: ServerConfig) -> BrowserPolicy:
    """A keyless loopback server checks Host (a page rebinding a name to 127.0.0.1 has no key to
    show); any server does once --allowed-host names one."""
    return BrowserPolicy(
        check_host=bool(config.allowed_hosts) or (config.api_key is None and is_loopback(config.host)),
        allowed_hosts=frozenset(config.allowed_hosts),
        cors_origins=frozenset(config.cors_origins),
    )


def add_middleware(app: FastAPI, service: Service) -> None:
    """From the outside in: Measured (every request counted for /metrics), LastWord (drain
    cut-offs and cut streams end in one log line), the browser checks (browser.BrowserGuard), the
    key (middleware.RequireKey)."""
    if service.config.api_key:
        app.add_middleware(RequireKey, key=service.config.api_key)
    app.add_middleware(BrowserGuard, policy=browser_policy(service.config))
    app.add_middleware(LastWord)
    metrics = Metrics(service.pool.queue.qsize, lambda: service.pool.running, service.sample_rate)
    service.pool.on_synthesis = metrics.synthesis
    app.state.metrics = metrics
    app.add_middleware(Measured, metrics=metrics, route_of=route_templates(app))


def add_info_routes(app: FastAPI, service: Service) -> None:
    """What the server has: /health, the models, voices and languages, /metrics."""
    from fastapi.responses import JSONResponse, Response

    @app.get("/health")
    async def health() -> JSONResponse:
        pool = service.pool
        body = {
            "status": "draining" if pool.draining else "ok",
            "workers": pool.workers,
            "running": pool.running,
            "queued": pool.queue.qsize(),
            "queue_size": pool.queue_size,
            **pool.counts,
        }
        return JSONResponse(body, status_code=503 if pool.draining else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": service.model_entries()}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict[str, Any]:
        """One model, as OpenAI's GET /v1/models/{model}; 404 in its shape for an unknown id."""
        for item in service.model_entries():
            if item["id"] == model_id:
                return item
        raise refuse(
            "model_not_found",
            "model",
            detail=f"model {model_id!r} does not exist; this server has {', '.join(service.model_ids())}",
        )

    @app.get("/v1/audio/models")
    async def speech_models() -> dict[str, Any]:
        """The speech models, as Open WebUI reads them (`models`: [{"id"}]) and as OpenAI lists models."""
        data = [item for item in service.model_entries() if item["served"]]
        return {"object": "list", "models": [{"id": item["id"]} for item in data], "data": data}

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        """`voices`: [{"id", "name"}], the shape Open WebUI parses; `data`: every voice in full."""
        data = [voice_item(entry) for entry in service.voice_catalogue()]
        return {"object": "list", "voices": [{"id": item["id"], "name": item["name"]} for item in data], "data": data}

    @app.get("/v1/audio/languages")
    async def list_languages() -> dict[str, Any]:
        """The `language` values the model knows (ids; names and tags like en-US resolve too)."""
        return {"object": "list", "data": service.languages()}

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus' text format (omnivoice_onnx.serve.metrics lists the series)."""
        return Response(app.state.metrics.render(), media_type=METRICS_CONTENT_TYPE)


def add_voice_routes(app: FastAPI, service: Service) -> None:
    """One voice, and saved voices changed over HTTP (POST, PATCH, DELETE: only with
    --allow-voice-save, else the table's voices_read_only)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.get("/v1/audio/voices/{name}")
    async def get_voice(name: str) -> dict[str, Any]:
        """One voice: a saved one, a preset or a mode (any case)."""
        for entry in service.voice_catalogue():
            if entry.name.casefold() == name.casefold():
                return voice_item(entry)
        raise refuse(
            "voice_not_found", "voice", detail=f"no voice {name!r}; voices: {', '.join(service.voice_names())}"
        )

    def require_save(param: str | None = None) -> None:
        if not service.config.allow_voice_save:
            raise refuse("voices_read_only", param)

    def saved(name: str) -> voice_store.Voice:
        """The saved voice `name` (any case); 404 if there is none, 500 if its file is damaged."""
        found = service.saved_voice(name)
        if found is None:
            raise refuse("voice_not_found", "voice", detail=f"no saved voice {name!r}")
        return found

    def changed(exc: UserError, name: str) -> ApiError:
        """A write refused under the voice's lock: 404 if `name` went meanwhile, else 409 (taken)."""
        if voice_store.find_saved(service.voices, name) is None:
            return refuse("voice_not_found", "voice", detail=f"no saved voice {name!r}")
        return refuse("voice_exists", "name", detail=service.scrub(str(exc)))

    async def create_voice(request: Request) -> JSONResponse:
        """Multipart: name, and ref_audio (a file) + ref_text, and/or instruct (voice design in the
        vocabulary). 201 with the voice; 409 if the name is taken (any case)."""
        require_save("name")
        with service.pool.upload_slot():
            return await created_voice(request)

    async def created_voice(request: Request) -> JSONResponse:
        form = await read_form(request)
        name = forms.new_voice_name(form_text(form, "name", required=True), "name")
        instruct, seed = form_text(form, "instruct"), forms.form_seed(form)
        upload = form.get("ref_audio")
        if upload is None and instruct is None:
            raise refuse(
                "missing_required_parameter",
                "ref_audio",
                detail="a voice needs ref_audio (a recording) + ref_text, or an instruct",
            )
        if voice_store.find_saved(service.voices, name) is not None:
            raise refuse("voice_exists", "name", detail=f"voice {name!r} already exists; rename or delete it first")
        if instruct is not None:
            try:
                resolve_instruct(instruct, False, service.tts.runtime_config["instruct"])
            except UserError as exc:
                raise refuse("invalid_instruct", "instruct", detail=str(exc)) from None
        prompt = None
        if upload is not None:
            upload, ref_text = await form_upload(form)
            prompt = (await encoded_upload(service, request, upload, ref_text))[0]
        voice = voice_store.new_voice(name, prompt, instruct.strip() if instruct else None, service.fingerprint, seed)
        try:
            await asyncio.to_thread(voice_store.save_voice, service.voices, name, voice, False)
        except UserError as exc:  # a concurrent create of the same name won the lock
            raise refuse("voice_exists", "name", detail=service.scrub(str(exc))) from None
        LOG.info("saved voice %s (POST /v1/audio/voices)", name)
        return JSONResponse(voice_item(VoiceEntry.saved(voice)), status_code=201)

    async def rename_voice(request: Request) -> JSONResponse:
        """JSON {"name": NEW}: the saved voice renamed (a change of case alone included)."""
        require_save("name")
        old = request.path_params["name"]
        body = door.json_object(await read_body(request, service.config.max_body_bytes), "the request body")
        new = forms.new_voice_name(door.typed(body, "name", str, required=True), "name")
        voice = saved(old)
        try:
            await asyncio.to_thread(voice_store.rename_voice, service.voices, old, new)
        except UserError as exc:
            raise changed(exc, old) from None
        LOG.info("renamed voice %s to %s (PATCH /v1/audio/voices)", old, new)
        return JSONResponse(voice_item(VoiceEntry.saved(dataclasses.replace(voice, name=new))))

    async def delete_voice(request: Request) -> JSONResponse:
        require_save()
        name = request.path_params["name"]
        saved(name)
        try:
            path = await asyncio.to_thread(voice_store.remove_voice, service.voices, name)
        except UserError as exc:
            raise changed(exc, name) from None
        LOG.info("deleted voice %s (DELETE /v1/audio/voices)", path.stem)
        return JSONResponse({"id": path.stem, "object": "voice.deleted", "deleted": True})

    # Plain Starlette routes: each reads its own body or form (size limits first).
    app.router.add_route("/v1/audio/voices", create_voice, methods=["POST"])
    app.router.add_route("/v1/audio/voices/{name}", rename_voice, methods=["PATCH"])
    app.router.add_route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"])


def add_reference_routes(app: FastAPI, service: Service) -> None:
    """POST /v1/audio/references: an uploaded recording becomes a voice (in memory, or saved)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    async def add_reference(request: Request) -> JSONResponse:
        """Body: a reference recording (any format libsndfile reads); query: ref_text (its words),
        and save_as=NAME to keep it as a saved voice (only with --allow-voice-save). Answers the
        voice id to name in speech requests: NAME when saved, else an in-memory "ref-..." id."""
        ref_text, save_as = request.query_params.get("ref_text"), request.query_params.get("save_as")
        if not ref_text or not ref_text.strip():
            raise refuse(
                "missing_required_parameter",
                "ref_text",
                detail="ref_text (the words spoken in the reference) is required",
            )
        if save_as is not None and not service.config.allow_voice_save:
            raise refuse("voice_save_disabled", "save_as")
        if save_as is not None:
            forms.new_voice_name(save_as, "save_as")
        with service.pool.upload_slot():
            with await spooled_body(request, door.MAX_REFERENCE_BYTES) as body:
                if not body.read(1):
                    raise refuse("empty_body")
                body.seek(0)
                prompt, digest = await encoded_upload(service, request, body, ref_text)
        if save_as is None:
            return JSONResponse({"id": service.add_reference(prompt, digest), "saved": False})
        voice = voice_store.Voice(save_as, prompt, None, service.fingerprint, Path())
        await asyncio.to_thread(voice_store.save_voice, service.voices, save_as, voice)
        LOG.info("saved voice %s (POST /v1/audio/references)", save_as)
        return JSONResponse({"id": save_as, "saved": True})

    app.router.add_route("/v1/audio/references", add_reference, methods=["POST"])  # reads its body itself


def add_speech_routes(app: FastAPI, service: Service) -> None:
    """POST /v1/audio/speech (OpenAI's speech route: streams and whole clips), its one-call clone,
    and POST /v1/audio/script."""
    from fastapi import Request
    from fastapi.responses import Response, StreamingResponse
    from pydantic import ValidationError

    SpeechRequest = speech_request_model()
    ScriptRequest = script_request_model()

    async def speech(request: Request) -> Any:
        body = await read_body(request, service.config.max_body_bytes)
        return await run_speech(request, parsed_body(SpeechRequest, body))

    async def speech_clone(request: Request) -> Any:
        """One call: clone the uploaded ref_audio (with ref_text) and speak `input` in that voice.
        Multipart: input, ref_audio (a file), ref_text, and the speech fields (response_format,
        speed, seed, stream_format, stream, language, instructions, num_step, guidance_scale,
        duration, model). The fields are checked before the reference is encoded."""
        parsed, voice = await cloned_voice(request)
        return await run_speech(request, parsed.model_copy(update={"voice": voice}))

    async def cloned_voice(request: Request) -> tuple[Any, str]:
        """A clone form's speech fields as a checked SpeechRequest, and the voice id of its recording,
        encoded within an upload slot (its bytes are let go before the synthesis queues)."""
        with service.pool.upload_slot():
            form = await read_form(request)
            if form.get("voice") is not None:
                raise refuse("unknown_parameter", "voice", field="voice (a clone request's voice is its ref_audio)")
            fields: dict[str, Any] = {"model": MODEL_ID, "voice": "auto"}
            for name, value in form.multi_items():
                if name not in ("ref_audio", "ref_text"):
                    fields[name] = form_value(name, value)
            try:
                parsed = SpeechRequest.model_validate(fields)
            except ValidationError as exc:
                raise validation_error(exc) from None
            upload, ref_text = await form_upload(form)
            prompt, digest = await encoded_upload(service, request, upload, ref_text)
        return parsed, service.add_reference(prompt, digest)

    async def run_speech(request: Request, parsed: Any) -> Any:
        """A checked speech request queued, run and answered (whole, streamed or as SSE)."""
        loop = asyncio.get_running_loop()
        job, fmt = build_job(service, parsed, loop)
        service.pool.submit(job)  # queue_full / shutting_down: the table's, with Retry-After
        timer = loop.call_at(loop.time() + service.config.timeout_s, time_out, job)
        headers = {"X-Seed": str(job.request.seed), **instruction_headers(job.request.instruct_readings[0])}
        first = await first_or_failure(job, request, timer, service.pool.draining)
        if not job.stream:
            timer.cancel()
            # an mp3 of minutes: not on the event loop
            data = await asyncio.to_thread(encode_audio, first[1], service.sample_rate, fmt)
            return Response(data, media_type=service.formats[fmt].media_type, headers=headers)
        chunks = stream_bytes(job, first, StreamEncoder(fmt, service.sample_rate), timer)
        if parsed.stream_format == "sse":
            tts = service.tts
            input_tokens = len(tts.tokenizer.encode(job.request.texts[0], add_special_tokens=False))
            return StreamingResponse(
                sse_events(chunks, job, input_tokens, tts.model.hop_length),
                media_type="text/event-stream",
                headers=headers,
            )
        return StreamingResponse(chunks, media_type=service.formats[fmt].media_type, headers=headers)

    async def script(request: Request) -> Any:
        """Every line checked (its voice, its text: the speech route's checks) before the first is
        queued; then the lines are made one after another, each with its own voice, joined with
        `pause` seconds of silence, streamed line by line (as /v1/audio/speech streams) or whole."""
        body = await read_body(request, service.config.max_body_bytes)
        parsed = parsed_body(ScriptRequest, body)
        if parsed.model is not None:
            check_model(service, parsed.model)
        fmt = response_format(service, parsed.response_format)
        stream = streams(service, fmt, None, parsed.stream)
        loop = asyncio.get_running_loop()
        jobs = [plan_line(service, parsed, index, loop) for index in range(len(parsed.script))]
        deadline = loop.time() + service.config.timeout_s
        pause = np.zeros(round(parsed.pause * service.sample_rate), np.float32)
        headers = {"X-Seeds": ",".join(str(job.request.seed) for job in jobs)}

        async def lines() -> AsyncGenerator[np.ndarray, None]:
            """Each line's audio in turn (a pause before all but the first); at the end, done or
            failed, every line's job is cancelled (queued ones dropped)."""
            try:
                for index, job in enumerate(jobs):
                    service.pool.submit(job)
                    timer = loop.call_at(deadline, time_out, job)
                    audio = (await first_or_failure(job, request, timer, service.pool.draining))[1]
                    timer.cancel()
                    yield np.concatenate([pause, audio]) if index else audio
            finally:
                for job in jobs:
                    job.cancel.set()

        made = lines()
        first = await made.__anext__()  # the first line's failure is the answer's status
        if not stream:
            pieces = [first] + [piece async for piece in made]
            data = await asyncio.to_thread(encode_audio, np.concatenate(pieces), service.sample_rate, fmt)
            return Response(data, media_type=service.formats[fmt].media_type, headers=headers)

        async def chunks() -> AsyncIterator[bytes]:
            encoder = StreamEncoder(fmt, service.sample_rate)
            try:
                yield encoder.start() + encoder.write(first)
                async for piece in made:
                    yield encoder.write(piece)
                yield encoder.finish()
            except ApiError as exc:  # after the headers: the stream is cut short (LastWord logs it)
                raise StreamFailed(exc.message) from None
            finally:
                encoder.close()
                await made.aclose()

        return StreamingResponse(chunks(), media_type=service.formats[fmt].media_type, headers=headers)

    # Plain Starlette routes: each reads and checks its own body (size first, then OpenAI-shaped 400s).
    app.router.add_route("/v1/audio/speech", speech, methods=["POST"])
    app.router.add_route("/v1/audio/speech/clone", speech_clone, methods=["POST"])  # reads its form itself
    app.router.add_route("/v1/audio/script", script, methods=["POST"])


def parsed_body(model: type[BaseModel], body: bytes) -> Any:
    """A JSON body as `model`, or the table's 400 (invalid_json, or the first field pydantic refused)."""
    from pydantic import ValidationError

    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            raise refuse("invalid_json") from None
        raise validation_error(exc) from None


def plan_line(service: Service, script: Any, index: int, loop: asyncio.AbstractEventLoop) -> Job:
    """Script line `index` as the speech route's job (plan_job: its voice resolved, checked by the
    runtime), with the script's shared fields under the line's own; a refusal names the line."""
    line = script.script[index]
    own = {name: getattr(line, name) for name in ("language", "speed", "seed")}
    shared = {name: getattr(script, name) if value is None else value for name, value in own.items()}
    config = {"num_step": script.num_step, "guidance_scale": script.guidance_scale}
    speech = Speech(line.text, line.voice, line.instructions, **shared, **config)
    try:
        return plan_job(service, speech, loop, stream=False)
    except ApiError as exc:
        param = f"script.{index}" + (f".{exc.param}" if exc.param else "")  # pydantic's spelling of a line
        raise ApiError(exc.status, f"script line {index + 1}: {exc.message}", param, exc.code, exc.kind) from None


async def encoded_upload(
    service: Service, request: Any, source: bytes | IO[bytes], ref_text: str
) -> tuple[VoiceClonePrompt, str]:
    """An uploaded recording encoded by a worker (Service.encode_reference as a task), and its digest."""
    run = lambda tts: service.encode_reference(tts, source, ref_text)  # noqa: E731 (a worker's task)
    return await task_result(service.pool, run, request, service.config.timeout_s)


def load_service(config: ServerConfig) -> Service:
    """Load one OmniVoiceOnnx per worker and check the voices folder, before the port opens."""
    threads = worker_threads(config.workers, config.threads)
    # The first load checks the bundle's files against its report; the others skip the re-hash.
    models = [
        OmniVoiceOnnx.from_dir(
            config.model_dir, threads=threads, resident_codecs=True, variant=config.variant, verify=i == 0
        )
        for i in range(config.workers)
    ]
    formats = available_response_formats()
    default = config.default_format or ("mp3" if "mp3" in formats else "wav")
    if default not in formats:
        raise UserError(f"--default-format {default} is not available here", f"choose one of {', '.join(formats)}")
    first = models[0]
    voices = voice_store.voices_dir(first.bundle, config.voices_dir)
    shelf = voice_store.VoiceShelf(voices)
    shelf.listing().voices()  # a damaged voice file is named now, not at the first request
    try:  # the defaults pass the one request check now, not at the first request
        first.validate("A default.", **keywords(config.request_defaults))
    except UserError as exc:
        raise UserError(f"--num-step/--guidance-scale/--language: {exc.problem}", exc.fix) from None
    folders = {"<voices>": voices, "<model>": Path(config.model_dir)}
    return Service(
        config=config,
        pool=WorkerPool(list(models), config.queue_size, folders),
        voices=voices,
        shelf=shelf,
        formats=formats,
        default_format=default,
        fingerprint=first.metadata["model_fingerprint"],
        variant=first.variant,
        sample_rate=first.sample_rate,
        random_weights=random_weights(first.bundle.report),
    )


def serve(config: ServerConfig) -> int:
    """Run the server until SIGTERM/SIGINT; the exit code (0 drained, 143/130 requests cut off)."""
    import uvicorn

    open_warning = check_auth(config)
    listener = bind(config.host, config.port)  # a busy port is named before the models load
    service = load_service(config)
    host, port = listener.getsockname()[:2]

    def announce() -> None:  # once the server's own SIGTERM/SIGINT handlers are in place
        LOG.info(
            "omnivoice-onnx serve: %d worker(s) x %d thread(s), queue %d, default format %s, voices %s",
            service.pool.workers,
            worker_threads(config.workers, config.threads),
            config.queue_size,
            service.default_format,
            service.voices,
        )
        LOG.info("%s%s", LISTENING, f"http://{f'[{host}]' if ':' in host else host}:{port}/v1")
        if open_warning is not None:
            LOG.warning("%s", open_warning)

    server = make_server(
        uvicorn.Config(
            create_app(service),
            host=config.host,
            port=config.port,
            log_level="info",
            timeout_graceful_shutdown=math.ceil(config.drain_s),
            lifespan="on",
            http=http_protocol(),
            timeout_keep_alive=math.ceil(door.KEEP_ALIVE_S),
            h11_max_incomplete_event_size=door.MAX_HEADER_BYTES,
        ),
        on_stop=lambda: setattr(service.pool, "draining", True),
        on_ready=announce,
    )
    server.run(sockets=[listener])
    stopped_by: int | None = server.stopped_by  # make_server's Server (a class it builds: uvicorn is imported there)
    if stopped_by is not None and service.pool.cut_off:
        return 128 + stopped_by
    return 0
