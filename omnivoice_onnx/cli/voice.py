"""Keep voices by name: encode a reference once, speak with it later as `speak --voice NAME`.

    omnivoice-onnx voice add alice --ref-audio ref.wav --ref-text "The reference's words."
    omnivoice-onnx voice add calm --instruct "female, low pitch" --seed 7   # a designed voice
    omnivoice-onnx voice list                        # the saved voices, then the presets (alloy, marin, ...)
    omnivoice-onnx voice show alice
    omnivoice-onnx voice remove alice
    omnivoice-onnx voice import my_voice.pt bob      # upstream VoiceClonePrompt.save file, read without torch

A voice is a small JSON file <voices>/<name>.json holding the reference's encoded tokens, its
transcript and RMS (or an instruct), the seed it speaks with, and the fingerprint of the model
that made them. The voices folder is --voices, else $OMNIVOICE_VOICES, else <model-dir>/voices;
with --model-dir hf:ORG/NAME, else $XDG_DATA_HOME/omnivoice-onnx/voices/ORG/NAME (by default
~/.local/share/...), never the Hugging Face cache, whose folders a new revision or a clean-up
replaces. A voice belongs to one model: another bundle refuses it.

A designed voice is its instruct AND a seed (the same instruct with another seed is another
speaker): `voice add --instruct` keeps --seed, or draws one and prints it, so the voice sounds the
same on every request; a request's own --seed still wins. A saved voice of a preset's name (alloy,
marin, ...) replaces that preset.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnivoice_onnx.bundle import Bundle, Folder
from omnivoice_onnx.cli.flags import DefaultsHelpFormatter, Subparsers, add_bundle_flags
from omnivoice_onnx.contract import FRAME_RATE
from omnivoice_onnx.errors import UserError, say
from omnivoice_onnx.program import SEED, note, prepare
from omnivoice_onnx.voices import (
    PRESETS,
    REPLACE_FIX,
    VOICE_SUFFIX,
    Voice,
    check_new_name,
    find_saved,
    list_voices,
    load_upstream_voice,
    new_voice,
    read_voice,
    remove_voice,
    save_voice,
    voice_files,
    voice_path,
    voices_dir,
)


def _common(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_bundle_flags(parser, variant=False)
    return prepare(parser)


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "voice",
        help="keep voices by name: add, list, show, remove, import",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="voice_command", metavar="ACTION", required=True)
    fmt = DefaultsHelpFormatter

    add = _common(
        actions.add_parser("add", help="encode a reference (or keep an instruct) as a named voice", formatter_class=fmt)
    )
    add.add_argument("name", help="the voice's name (letters, digits, '_' and '-')")
    add.add_argument("--ref-audio", "--ref_audio", dest="ref_audio", help="the reference recording (wav/flac)")
    add.add_argument("--ref-text", "--ref_text", dest="ref_text", help="what the reference says (its transcript)")
    add.add_argument(
        "--instruct", help="a voice-design instruct instead of (or with) a reference, e.g. 'female, low pitch'"
    )
    add.add_argument(
        "--seed",
        type=SEED,
        default=None,
        help="the seed the voice speaks with when a request gives none (default: a designed voice draws "
        "one now; a cloned voice keeps none)",
    )
    add.add_argument("--force", action="store_true", help="replace a voice of that name")

    _common(actions.add_parser("list", help="the saved voices, then the presets", formatter_class=fmt))
    show = _common(actions.add_parser("show", help="one voice's contents", formatter_class=fmt))
    show.add_argument(
        "name", help="a voice's name (saved, or a preset), or a voice file's path (.json, or upstream .pt)"
    )
    remove = _common(actions.add_parser("remove", help="delete a saved voice", formatter_class=fmt))
    remove.add_argument("name", help="the voice's name")
    imp = _common(
        actions.add_parser(
            "import",
            help="keep an upstream VoiceClonePrompt.save (.pt) file as a named voice of this bundle",
            formatter_class=fmt,
        )
    )
    imp.add_argument("file", type=Path, help="the .pt file (read without torch; its pickle is never executed)")
    imp.add_argument("name", help="the voice's name")
    imp.add_argument("--force", action="store_true", help="replace a voice of that name")
    return parser


def _target(args: argparse.Namespace, voices: Path) -> Path:
    """The file a new voice `args.name` goes to; refused now, before any work, if it exists without --force."""
    path = voice_path(voices, args.name)
    existing = find_saved(voices, args.name)  # names are matched whatever their case
    if existing is not None and not args.force:
        raise UserError(f"voice {args.name!r} already exists ({existing})", REPLACE_FIX)
    return path


def _add(args: argparse.Namespace, voices: Path) -> Voice:
    if args.ref_audio is None and args.instruct is None:
        raise UserError(
            "voice add needs a reference (--ref-audio F --ref-text T) or an --instruct",
            "pass --ref-audio and --ref-text, or --instruct 'female, low pitch'",
        )
    if (args.ref_audio is None) != (args.ref_text is None):
        raise UserError(
            "--ref-audio and --ref-text go together (this runtime has no speech recogniser)",
            "pass the reference's transcript with --ref-text"
            if args.ref_text is None
            else "pass the recording with --ref-audio",
        )
    _target(args, voices)
    if args.ref_audio is None:  # a designed voice: no graph needs to run, only the instruct checked
        from omnivoice_onnx.core.instruct import resolve_instruct

        bundle = Bundle.open(args.model_dir, verify=False)  # its metadata and config only: no graph loads
        resolve_instruct(args.instruct, False, bundle.runtime_config["instruct"])
        return new_voice(args.name, None, args.instruct.strip(), bundle.fingerprint, args.seed)
    from omnivoice_onnx.api import OmniVoiceOnnx

    tts = OmniVoiceOnnx.from_dir(args.model_dir)
    if args.instruct is not None:
        from omnivoice_onnx.core.instruct import resolve_instruct

        resolve_instruct(args.instruct, False, tts.runtime_config["instruct"])
    prompt = tts.create_voice_clone_prompt(args.ref_audio, args.ref_text)
    instruct = args.instruct.strip() if args.instruct else None
    return new_voice(args.name, prompt, instruct, tts.metadata["model_fingerprint"], args.seed)


def describe(voice: Voice, frame_rate: int) -> str:
    """One line: kind, length or instruct, transcript, seed."""
    parts = ["preset"] if voice.is_preset else []
    if voice.prompt is not None:
        seconds = voice.prompt.ref_audio_tokens.shape[-1] / frame_rate
        parts.append(f"clone {seconds:.1f} s {voice.prompt.ref_text!r}")
    if voice.instruct is not None:
        parts.append(f"design {voice.instruct!r}")
    if voice.seed is not None:
        parts.append(f"seed {voice.seed}")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    voices = voices_dir(Folder(args.model_dir), args.voices)

    if args.voice_command in ("add", "import"):
        check_new_name(args.name)  # a reserved name is refused before any file is read
        if args.voice_command == "import":
            # Read (or refused) first: a crafted file is stopped before anything else happens.
            upstream = load_upstream_voice(args.file)
            _target(args, voices)
            voice = Voice(
                args.name, upstream.prompt, None, Bundle.open(args.model_dir, verify=False).fingerprint, Path()
            )
        else:
            voice = _add(args, voices)
        path = save_voice(voices, args.name, voice, replace=args.force)  # checked again under the name's lock
        say(f"saved voice {args.name!r}: {describe(voice, FRAME_RATE)} -> {path}")
    elif args.voice_command == "list":
        found = list_voices(voices)
        if not found:
            say(
                f"no voices in {voices} (add one with `omnivoice-onnx voice add NAME --ref-audio F --ref-text T`)",
                file=sys.stderr,
            )
        hidden = {voice.name.casefold() for voice in found}
        presets = [preset for name, preset in PRESETS.items() if name not in hidden]  # a saved one hides it
        width = max((len(v.name) for v in found + presets), default=0)
        for voice in found:
            say(f"{voice.name:<{width}}  {describe(voice, FRAME_RATE)}  model {voice.model_fingerprint}")
        for voice in presets:
            say(f"{voice.name:<{width}}  {describe(voice, FRAME_RATE)}")
        unlisted = sorted(set(voices.glob(f"*{VOICE_SUFFIX}")) - set(voice_files(voices).values()))
        if unlisted:
            note(
                f"not listed: {', '.join(path.name for path in unlisted)}: no request can name a voice so "
                "(a letter or digit, then letters, digits, '_' or '-'; not auto, design or ref-...); rename or remove"
            )
    elif args.voice_command == "show":
        voice = read_voice(args.name, voices)
        say(f"name               {voice.name}")
        if voice.is_preset:
            say("file               none: a built-in preset (save a voice of this name to replace it)")
        else:
            say(f"file               {voice.path}")
            say(f"model fingerprint  {voice.model_fingerprint or 'unknown (an upstream .pt carries none)'}")
        if voice.prompt is not None:
            tokens = voice.prompt.ref_audio_tokens
            say(f"reference tokens   {list(tokens.shape)} ({tokens.shape[-1] / FRAME_RATE:.2f} s)")
            say(f"reference text     {voice.prompt.ref_text}")
            say(f"reference RMS      {voice.prompt.ref_rms:.6g}")
        if voice.instruct is not None:
            say(f"instruct           {voice.instruct}")
        if voice.seed is not None:
            say(f"seed               {voice.seed} (used when a request gives none)")
        elif voice.prompt is None:
            say(
                "seed               none saved: each request draws one, another speaker each time (save it again "
                "with `omnivoice-onnx voice add NAME --instruct ... --seed N --force` to keep one)"
            )
    elif args.voice_command == "remove":
        path = remove_voice(voices, args.name)
        say(f"removed voice {args.name!r} ({path})")
    return 0
