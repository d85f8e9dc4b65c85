"""Form bodies and the small pieces the speech, clone and voice routes share: a multipart or
url-encoded body read within its limit, its fields as the JSON body would carry them, a voice as
the voice routes list it, a new voice's name checked, and the headers that report how prose instructions were read."""

from __future__ import annotations

import logging
import urllib.parse
from typing import IO, Any

from omnivoice_onnx import limits
from omnivoice_onnx import voices as voice_store
from omnivoice_onnx.core.instruct import instructions_note
from omnivoice_onnx.core.shapes import InstructReading
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.serve import door
from omnivoice_onnx.serve.connection import body_pieces
from omnivoice_onnx.serve.door import refuse

LOG = logging.getLogger("omnivoice_onnx.server")

# A multipart body: one reference recording (MAX_REFERENCE_BYTES) and a few short fields.
MAX_FORM_BYTES = door.MAX_REFERENCE_BYTES + 64 * 1024
MAX_FORM_FIELD_BYTES = 64 * 1024
# Form fields arrive as text: these are converted to the number or boolean the JSON body carries.
FORM_NUMBERS = {"speed": float, "guidance_scale": float, "duration": float, "seed": int, "num_step": int}
FORM_BOOLEANS = ("strict_instructions", "stream")


def instruction_headers(reading: InstructReading) -> dict[str, str]:
    """X-Instructions-Applied / -Ignored for a request with instructions: the vocabulary items
    applied and the pieces ignored (UTF-8, percent-encoded: a header is Latin-1), and the log
    line when something was ignored."""
    if not reading.applied and not reading.ignored:
        return {}
    if reading.ignored:
        LOG.info("%s", instructions_note(reading))
    safe = " ,;:'()?!-"
    return {
        "X-Instructions-Applied": urllib.parse.quote(", ".join(reading.applied), safe=safe),
        "X-Instructions-Ignored": urllib.parse.quote("; ".join(reading.ignored), safe=safe),
    }


async def read_form(request: Any) -> Any:
    """A multipart/form-data body (or a url-encoded one, which has no file: what a client sends for
    a form of text fields alone), MAX_FORM_BYTES at most, read as every body is (body_pieces: 413,
    408) and parsed as it arrives by starlette's parsers (python-multipart: a file part past 1 MiB
    is spooled to disk); 400 for another content type or a broken body."""
    from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

    kind = request.headers.get("content-type", "")
    if not kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise refuse("invalid_content_type")
    body = body_pieces(request, MAX_FORM_BYTES)  # parsed as it arrives: the file part spools to disk
    try:
        if kind.startswith("application/x-www-form-urlencoded"):
            return await FormParser(request.headers, body).parse()
        return await MultiPartParser(
            request.headers, body, max_files=1, max_fields=32, max_part_size=MAX_FORM_FIELD_BYTES
        ).parse()
    except MultiPartException as exc:
        raise refuse("invalid_multipart", detail=exc.message) from None


def form_text(form: Any, name: str, required: bool = False) -> str | None:
    """A text field of a form (None when absent); 400 for a file in its place or a missing required one."""
    value = form.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise refuse("missing_required_parameter", name, detail=f"missing required field {name!r}")
        return None
    if not isinstance(value, str):
        raise refuse("invalid_type", name, field=name, expected="a text field, not a file")
    return value


def form_value(name: str, value: Any) -> Any:
    """A speech field from a form, as the JSON body would carry it (numbers and booleans converted)."""
    if not isinstance(value, str):
        raise refuse("invalid_type", name, field=name, expected="a text field, not a file")
    try:
        if name in FORM_NUMBERS:
            return FORM_NUMBERS[name](value)
    except ValueError:
        raise refuse("invalid_type", name, field=name, expected=door.TYPE_NAMES[FORM_NUMBERS[name]]) from None
    if name in FORM_BOOLEANS:
        if value.lower() not in ("true", "false", "1", "0"):
            raise refuse("invalid_type", name, field=name, expected="true or false")
        return value.lower() in ("true", "1")
    return value


async def form_upload(form: Any) -> tuple[IO[bytes], str]:
    """The form's ref_audio file (as the parser spooled it: on disk past 1 MiB, so a waiting upload
    holds no copy of its bytes in memory) and its ref_text; 400 naming what is missing."""
    upload = form.get("ref_audio")
    if upload is None or isinstance(upload, str):
        raise refuse(
            "missing_required_parameter",
            "ref_audio",
            detail="ref_audio must be the reference recording, sent as a file (curl -F 'ref_audio=@ref.wav')",
        )
    ref_text = form_text(form, "ref_text")
    if ref_text is None:
        raise refuse(
            "missing_required_parameter", "ref_text", detail="ref_text (the words spoken in ref_audio) is required"
        )
    if not await upload.read(1):
        raise refuse("invalid_reference", "ref_audio", detail="ref_audio is an empty file")
    await upload.seek(0)
    file: IO[bytes] = upload.file
    return file, ref_text


def voice_item(entry: Any) -> dict[str, Any]:
    """A voice as the voice routes show it: id and name (Open WebUI's), kind, its description or
    instruct, and the seed it speaks with when a request gives none (a preset's, a saved voice's)."""
    item: dict[str, Any] = {"id": entry.name, "name": entry.name, "kind": entry.kind}
    if entry.kind == "builtin":
        item["description"] = entry.text
    else:
        item["instruct"] = entry.text
    if entry.seed is not None:
        item["seed"] = entry.seed
    return item


def form_seed(form: Any) -> int | None:
    """A new voice's `seed` form field (None: none given; voices.new_voice draws one for a
    designed voice), else the table's 400 naming `seed`: checked before a reference is encoded."""
    if form.get("seed") is None:
        return None
    try:
        return limits.check_seed(form_value("seed", form.get("seed")))
    except UserError as exc:
        raise refuse("invalid_value", "seed", detail=str(exc)) from None


def new_voice_name(name: Any, param: str) -> str:
    """A name a voice may be saved under (voices.check_new_name: plain, not reserved), else the
    table's invalid_voice naming `param`: checked before anything is read further or written."""
    try:
        return voice_store.check_new_name(name)
    except UserError as exc:
        raise refuse("invalid_voice", param, detail=str(exc)) from None
