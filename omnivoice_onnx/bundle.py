"""The export folder (a bundle) as one object: its paths, its variants and the default one, one
read of export-report.json, its files hashed against the report, its graphs' metadata.

    bundle = Bundle.open("onnx")                  # the default variant, every file it loads verified
    bundle = Bundle.open("onnx", variant="int8", verify=False)
    bundle.path("transformer"), bundle.fingerprint, bundle.variants, bundle.runtime_config

OmniVoiceOnnx.from_dir, `omnivoice-onnx info`, `voice`, `serve` and `batch` all open the folder
through here, so a damaged file is refused the same way everywhere.

Verification: a damaged graph sidecar loads and runs (zeroed weights of the default fp32-fused
graph, or of an fp32 codec, gave audio with exit 0, and step 6 measured nothing wrong). The
export and step 5 record every file they write as {sha256, bytes} in the report; `verify` hashes
each file the variant loads (its transformer, both codec graphs, each with its sidecar,
tokenizer.json and runtime-config.json) and names the step that remakes a file that differs:
the export's own files `re-run export_omnivoice.py`, a variant's `run quantize_omnivoice.py
--variants NAME`. Cost: one read of every file loaded (at the real dims 1.55 GB for int8: 4.5 s
of a 6.2 s load with a page cache holding part of it, 1.6 s warm). A file found as recorded is
remembered by its stat identity in the user's cache (verified.VerifiedFiles), so the next load of the same
unchanged files hashes nothing; a server pays it once either way. What is verified is what runs:
tokenizer.json and runtime-config.json are parsed from the bytes that were hashed, and each graph's
files must keep the identity they were hashed under once onnxruntime has loaded them and after
every call (check_loaded: onnxruntime maps a sidecar, it does not copy it). A bundle without a report
(assembled by hand, a port's test folder) is refused unless the check is skipped (verify=False, or
OMNIVOICE_VERIFY=0); the graphs' metadata and runtime-config.json's values are checked either
way (Bundle.transformer_metadata and check_graphs once the sessions are made,
runtime_config.load_runtime_config).

Metadata is read from the .onnx protobuf (omnivoice_onnx.graphmeta; the weights are in the
sidecar): no onnxruntime session, no `onnx` package. Licence: each graph's metadata carries
`license` and `source`; the bundle's README.md (the model card) repeats them in its YAML header.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omnivoice_onnx.contract import (
    AUDIO_VOCAB_SIZE,
    FP32_VARIANT,
    GRAPH_FILES,
    NUM_CODEBOOKS,
    REPORT_FILE,
    codec_paths,
    contract_table,
    ort_signature,
    signature_problems,
    variant_dir,
    variant_path,
    variants_present,
)
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import confined
from omnivoice_onnx.graphmeta import read_metadata_props
from omnivoice_onnx.hashing import FILE_ENTRY_SCHEMA
from omnivoice_onnx.reading import Each, Maybe, read_json, schema_problem
from omnivoice_onnx.runtime_config import load_runtime_config
from omnivoice_onnx.verified import VERIFY_ENV, Seen, VerifiedFiles, stat_identity, verify_mode

DEFAULT_MODEL_DIR = Path("onnx")  # where the commands look when no --model-dir is given
MODEL_CARD_FILE = "README.md"
TOKENIZER_FILE = "tokenizer.json"  # the text tokenizer (prompt.TextTokenizer reads it)
RUNTIME_CONFIG_FILE = "runtime-config.json"  # the host tables (runtime_config.load_runtime_config reads it)
VOICES_SUBDIR = "voices"  # the default voices folder: inside the bundle, so a copied bundle keeps its voices
MANIFEST_FILE = "release-manifest.json"  # a release archive's first member, kept in a downloaded folder
RERUN_EXPORT = "re-run export_omnivoice.py into an empty folder"
# What a user without a bundle is told: both ways to get one without the export toolchain.
GET_BUNDLE = (
    "pass a bundle folder (--model-dir), or get one: omnivoice-onnx download ORG/NAME --dir DIR (a "
    "Hugging Face repo; or --model-dir hf:ORG/NAME), or omnivoice-onnx download URL --sha256 HEX --dir DIR "
    "(a release archive); docs/download.md"
)
SKIP = f"or load it unchecked with verify=False / {VERIFY_ENV}=0"
# What the runtime reads of the report: the files of each graph, the runtime assets, the variants.
REPORT_FILES_SCHEMA = {"graphs": Each({"files": Each(FILE_ENTRY_SCHEMA)}), "runtime_assets": Each(FILE_ENTRY_SCHEMA)}
VARIANT_SCHEMA = {"dir": str, "files": Each(FILE_ENTRY_SCHEMA)}
# What the runtime reads of the report's other sections (info's verdicts, the variants listed),
# checked when it is read: a section of another shape is one line, never an AttributeError.
REPORT_SCHEMA = {
    "parity": Maybe(Each({"verdict": Maybe(str)})),
    "end_to_end": Maybe(Each({"verdict": Maybe(str)})),
    "variants": Maybe(Each(dict)),
}
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a folder name inside the export, never a path
# The transformer graph used when no variant is named: the first of these that the export holds.
# fp32-fused passes the fp32 verdicts (parity argmax 1.000000, tokens 100 %, its logits the same
# bits as the faithful graph's on every CPU call measured: investigation log) and runs faster; it
# needs the ONNX Attention operator of opset 23 (onnxruntime >= 1.23; a reduced mobile build may
# lack it: name variant="fp32" there). The one place the runtime's choice
# is made; infer_onnx.py --text takes it, its compare mode always runs the faithful graph.
DEFAULT_VARIANT_ORDER = ("fp32-fused", FP32_VARIANT)


def verify_requested(verify: Any) -> bool:
    """Whether to check sha256: `verify` (a bool), unless $OMNIVOICE_VERIFY is "0" (verify_mode)."""
    if not isinstance(verify, bool):
        raise UserError(
            f"verify must be True or False, got {type(verify).__name__} {verify!r:.40}",
            "pass verify=False only for a bundle without export-report.json",
        )
    return verify and verify_mode() != "off"


def variant_fix(variant: str) -> str:
    """What gets `variant`'s files (missing or damaged): a pip user downloads a bundle that holds
    it; in the export toolchain's checkout, the step that remakes it (step 5)."""
    if variant == FP32_VARIANT:
        return RERUN_EXPORT
    return (
        f"download a bundle that holds variant {variant} (omnivoice-onnx download), or, in the export "
        f"toolchain's checkout, run quantize_omnivoice.py --variants {variant}"
    )


def metadata_props(path: Path) -> dict[str, str]:
    """An ONNX graph's metadata_props, read from its .onnx file alone (omnivoice_onnx.graphmeta);
    a UserError naming the file when it cannot be read or is not an ONNX graph."""
    path = Path(path)
    try:
        return read_metadata_props(path)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})", "pass an export folder (export_omnivoice.py)") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a readable ONNX graph ({exc})", "re-run export_omnivoice.py") from exc


def card_license(model_dir: Path) -> str | None:
    """The `license:` of the bundle's model card YAML header, if the card is there."""
    try:
        text = Folder(model_dir).card_path.read_text(encoding="utf-8")
    except OSError:
        return None
    header = re.match(r"---\n(.*?)\n---\n", text, re.S)
    found = re.search(r"^license:\s*(\S.*)$", header.group(1), re.M) if header else None
    return found.group(1).strip() if found else None


# The files read whole into memory when verified, and parsed from those very bytes (tokenizer.json
# is ~11 MB at the real dims, runtime-config.json ~100 KB): nothing can swap them between the hash
# and the parse. The graphs (GBs) are hashed from the opened file and loaded by onnxruntime by
# path; Bundle.check_loaded then proves the path still leads to the file that was hashed.
READ_WHOLE = (TOKENIZER_FILE, RUNTIME_CONFIG_FILE)


@dataclass(frozen=True)
class FileCheck:
    """One file a variant loads, against its report entry."""

    path: Path
    entry: dict[str, Any]  # {sha256, bytes} as the report records it
    fix: str  # the step that remakes it

    def check(self, verified: VerifiedFiles) -> Seen | str:
        """What was seen when the file is the one recorded (hashed, or vouched for by `verified`'s
        record of an earlier hash of this very file); else why not (missing, or another size/sha256)."""
        try:
            if not self.path.is_file():
                raise FileNotFoundError
            seen = verified.matches(self.path, self.entry, whole=self.path.name in READ_WHOLE)
        except FileNotFoundError:  # also when it went between the test and the read
            return f"{self.path} is missing"
        if seen is None:
            return (
                f"{self.path} does not match the sha256 export-report.json records for it (damaged, "
                "truncated, replaced or from another export)"
            )
        return seen

    def problem(self, verified: VerifiedFiles) -> str | None:
        """Why the file is not the one recorded (None when it is): check()'s failure."""
        return None if isinstance(result := self.check(verified), Seen) else result


def check_folder(model_dir: str | os.PathLike[str]) -> Path:
    """`model_dir` as a Path when it is a folder; else the one refusal of a missing bundle, everywhere."""
    if not isinstance(model_dir, (str, os.PathLike)):
        raise UserError(
            f"model_dir must be a path, got {type(model_dir).__name__}", "pass the folder export_omnivoice.py wrote"
        )
    path = Path(model_dir)
    if not path.is_dir():
        raise UserError(f"export folder not found: {path}", GET_BUNDLE)
    return path


class Folder:
    """Where each file of a bundle folder lives: the one place the runtime joins a path inside a
    bundle (tests/test_structure.py holds every other module to it), so a reader finds every file
    the runtime touches here; the graphs' layout is contract.variant_path's rule, the toolchain's
    too. Not opened: Bundle is a Folder opened and verified; `voice list` needs only the voices."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(model_dir)

    @property
    def report_path(self) -> Path:
        return self.dir / REPORT_FILE

    @property
    def card_path(self) -> Path:  # the model card: its YAML header repeats the licence
        return self.dir / MODEL_CARD_FILE

    @property
    def runtime_config_path(self) -> Path:
        return self.dir / RUNTIME_CONFIG_FILE

    @property
    def tokenizer_path(self) -> Path:
        return self.dir / TOKENIZER_FILE

    @property
    def voices_path(self) -> Path:
        """The default voices folder (voices.voices_dir: --voices and $OMNIVOICE_VOICES come first)."""
        return self.dir / VOICES_SUBDIR

    @property
    def manifest_path(self) -> Path:  # a download's release manifest (omnivoice_onnx.fetch)
        return self.dir / MANIFEST_FILE

    def graph_path(self, graph: str, variant: str = FP32_VARIANT) -> Path:  # contract.variant_path's rule
        return variant_path(self.dir, variant, graph)

    def codec_paths(self, variant: str = FP32_VARIANT) -> dict[str, Path]:  # the encoder and decoder it loads
        return codec_paths(self.dir, variant)

    @property
    def variants(self) -> list[str]:  # those whose transformer graph is in the folder
        return variants_present(self.dir)

    def export_files(self) -> list[Path]:  # the export's own graphs and their sidecars (info --no-verify)
        return [self.dir / (name + suffix) for name in GRAPH_FILES.values() for suffix in ("", ".data")]

    def member(self, name: str) -> Path:  # a file the report or a release manifest lists, by relative path
        return self.dir / name


# Graph metadata (omnivoice_export.step2_export.exporting.graph_metadata) the runtime reads, as ints.
INT_METADATA = ("sample_rate", "hop_length", "frame_rate", "num_codebooks", "audio_vocab_size", "audio_mask_id")
# runtime-config.json's model section -> the graph metadata key that must agree with it (a port
# reads the config instead of the graphs' metadata_props, so both must say the same).
CONFIG_VS_METADATA = {
    "audio_mask_id": "audio_mask_id",
    "num_audio_codebook": "num_codebooks",
    "audio_vocab_size": "audio_vocab_size",
    "sample_rate": "sample_rate",
    "hop_length": "hop_length",
    "frame_rate": "frame_rate",
    "model_fingerprint": "model_fingerprint",
}


def graph_metadata(session: Any, path: Path, graph: str) -> dict[str, Any]:
    """A session's OmniVoice metadata (ints parsed), checked to describe `graph` and its inputs
    and outputs checked against the contract table."""
    meta = dict(session.get_modelmeta().custom_metadata_map)
    if meta.get("graph") != graph:
        raise UserError(
            f"{path} is not an OmniVoice {graph} graph (its metadata says graph={meta.get('graph')!r})", RERUN_EXPORT
        )
    problems = signature_problems(graph, *ort_signature(session))
    if problems:
        raise UserError(f"{path} does not meet the {graph} contract: {'; '.join(problems)}", RERUN_EXPORT)
    missing = [key for key in INT_METADATA + ("model_fingerprint",) if key not in meta]
    if missing:
        raise UserError(f"{path} lacks metadata {', '.join(missing)}", RERUN_EXPORT)
    try:
        values = {key: int(meta[key]) for key in INT_METADATA}
    except ValueError as exc:
        raise UserError(f"{path} has non-integer metadata ({exc})", RERUN_EXPORT) from exc
    problem = metadata_problem(values)
    if problem:
        raise UserError(f"{path} has impossible metadata: {problem}", RERUN_EXPORT)
    return {**meta, **values}


def metadata_problem(values: dict[str, int]) -> str | None:
    """What is wrong with a graph's int metadata, as the runtime's arithmetic uses it (None if
    nothing): rates and sizes positive, sample_rate = hop_length x frame_rate (frames <-> samples),
    the contract's codebooks and vocabulary, the mask id the vocabulary's last entry (the codes
    are [0, mask id): request.check_prompt)."""
    for key in ("sample_rate", "hop_length", "frame_rate"):
        if values[key] <= 0:
            return f"{key}={values[key]} (must be > 0)"
    if values["sample_rate"] != values["hop_length"] * values["frame_rate"]:
        return (
            f"sample_rate={values['sample_rate']} is not hop_length x frame_rate = "
            f"{values['hop_length']} x {values['frame_rate']}"
        )
    if (values["num_codebooks"], values["audio_vocab_size"]) != (NUM_CODEBOOKS, AUDIO_VOCAB_SIZE):
        return (
            f"num_codebooks={values['num_codebooks']}, audio_vocab_size={values['audio_vocab_size']} (the graphs "
            f"take {NUM_CODEBOOKS} and {AUDIO_VOCAB_SIZE})"
        )
    if values["audio_mask_id"] != values["audio_vocab_size"] - 1:
        return (
            f"audio_mask_id={values['audio_mask_id']} is not the vocabulary's last id {values['audio_vocab_size'] - 1}"
        )
    return None


class Bundle(Folder):
    """An export folder, opened: build it with `Bundle.open`."""

    def __init__(
        self, model_dir: Path, variant: str, report: dict[str, Any] | None, report_error: UserError | None = None
    ) -> None:
        super().__init__(model_dir)
        self.variant = variant  # the transformer variant loaded (named, or default_variant's choice)
        self.report = report  # export-report.json, read once (None: none readable, opened with verify=False)
        self.report_error = report_error  # why report is None: missing, unreadable, not an object
        self.seen: dict[Path, Seen] = {}  # each file verify() found as recorded (empty unverified)

    @classmethod
    def open(
        cls, model_dir: str | os.PathLike[str], variant: str | None = None, verify: bool = True, provider: str = "cpu"
    ) -> Bundle:
        """The folder at `model_dir` with `variant` (None: default_variant's choice for `provider`);
        with `verify`, every file the variant loads checked against the report first (UserError
        naming the first that differs, and the step that remakes it)."""
        if variant is not None and not (isinstance(variant, str) and VARIANT_NAME.fullmatch(variant)):
            present = variants_present(Path(model_dir)) if isinstance(model_dir, (str, os.PathLike)) else []
            raise UserError(
                f"variant must be a variant's name (a folder of the export), got {variant!r:.60}",
                f"pass one of {', '.join(present) or 'fp32'}, or None",
            )
        verify = verify_requested(verify)
        model_dir = check_folder(model_dir)
        try:
            report, report_error = read_report(model_dir), None
        except UserError as exc:
            if verify:
                raise
            report, report_error = None, exc  # unchecked on request; file_checks still says why, if asked
        bundle = cls(model_dir, variant or default_variant(model_dir, report, provider), report, report_error)
        bundle.transformer_path()  # a variant not in the folder is named before anything is hashed
        if verify:  # before anything is loaded: a damaged sidecar loads, and runs
            bundle.verify()
        return bundle

    def verify(self, variant: str | None = None) -> None:
        """Every file `variant` (default: the bundle's) loads is the one the report lists (size,
        then sha256, or VerifiedFiles' record of an earlier hash); else a UserError naming the first
        that is not, and the step that remakes it."""
        verified = VerifiedFiles.in_cache()
        try:
            for check in self.file_checks(variant):
                seen = check.check(verified)
                if isinstance(seen, str):  # the problem
                    raise UserError(seen, check.fix)
                self.seen[check.path] = seen
        finally:  # the files that passed are remembered even when a later one fails
            verified.save()

    def asset(self, name: str) -> bytes | None:
        """The verified bytes of the READ_WHOLE file `name` (None when the bundle was not verified:
        the reader then reads the file itself)."""
        seen = self.seen.get(self.member(name))
        return None if seen is None else seen.data

    def check_loaded(self, graph: Path) -> None:
        """After onnxruntime made a session of `graph`: every verified file it loads (the .onnx and
        its external data, `<name>.data`, beside it) still has the identity it had when it was
        hashed; else a UserError naming it. A file swapped (renamed over) or written to after its
        hash and before or while onnxruntime read it shows a new inode or ctime here, so the bytes
        the session holds are the ones that were hashed. No-op for an unverified bundle."""
        graph = Path(graph)
        for path, seen in self.seen.items():
            if path.parent != graph.parent or not path.name.startswith(graph.name):
                continue
            try:
                now = stat_identity(os.stat(path))
            except OSError:
                now = None
            if now != seen.identity:
                raise UserError(
                    f"{path} changed after it was verified, while it was being loaded (replaced or written to)",
                    f"load it again once nothing is writing the export folder; {RERUN_EXPORT} if it was damaged",
                )

    def path(self, graph: str, variant: str | None = None) -> Path:
        """`graph`'s file for `variant` (default: the bundle's): contract.variant_path."""
        return self.graph_path(graph, variant or self.variant)

    def transformer_path(self) -> Path:
        """The bundle variant's transformer graph; a variant not in the folder is a UserError
        naming those present."""
        path = self.path("transformer")
        if self.variant != FP32_VARIANT and not path.is_file():
            raise UserError(
                f"the export in {self.dir} has no transformer variant {self.variant!r} (present: "
                f"{', '.join(self.variants) or 'none'})",
                variant_fix(self.variant),
            )
        return path

    @functools.cached_property
    def metadata(self) -> dict[str, str]:
        """The export's own transformer graph's metadata (fingerprint, licence, source, constants),
        read without a session; a UserError when the folder holds no export. A folder holding one
        variant only (a release of it: omnivoice_onnx.fetch) answers from that variant's graph,
        whose metadata is the export's plus `variant` and `recipe` (quantize_omnivoice.py)."""
        path = self.path("transformer", FP32_VARIANT)
        if not path.is_file() and self.variant != FP32_VARIANT and self.path("transformer").is_file():
            path = self.path("transformer")
        if not path.is_file():
            raise UserError(
                f"{self.dir} holds no OmniVoice export ({path.name} not found)",
                "pass the folder export_omnivoice.py wrote (--model-dir)",
            )
        meta = metadata_props(path)
        if not meta.get("model_fingerprint"):
            raise UserError(f"{path} has no model_fingerprint metadata: not an OmniVoice export", RERUN_EXPORT)
        return meta

    @property
    def fingerprint(self) -> str:
        return self.metadata["model_fingerprint"]

    @functools.cached_property
    def runtime_config(self) -> dict[str, Any]:
        """runtime-config.json, checked (runtime_config.load_runtime_config), parsed from the bytes that
        were verified when the bundle was."""
        return load_runtime_config(self.runtime_config_path, self.asset(RUNTIME_CONFIG_FILE))

    def file_checks(self, variant: str | None = None) -> list[FileCheck]:
        """Every file `variant` (default: the bundle's) loads, with its report entry: the codec
        graphs, the runtime assets, and the export's transformer or the variant's own files."""
        variant = variant or self.variant
        path = self.report_path
        if self.report is None:
            raise self.report_error or UserError(f"export report not read: {path}", f"{RERUN_EXPORT}, {SKIP}")
        problem = schema_problem(self.report, REPORT_FILES_SCHEMA)
        if problem:  # a report of an earlier version (no runtime_assets), or a hand edit
            raise UserError(f"export report {path} is malformed: {problem}", f"{RERUN_EXPORT}, {SKIP}")
        checks = []
        for graph in ["encoder", "decoder"] + (["transformer"] if variant == FP32_VARIANT else []):
            entry = self.report["graphs"].get(graph)
            if entry is None:
                raise UserError(f"export report {path} lists no {graph} graph", RERUN_EXPORT)
            checks += [
                FileCheck(confined(self.dir, name, f"export report {path}", RERUN_EXPORT), info, RERUN_EXPORT)
                for name, info in entry["files"].items()
                if name.startswith(GRAPH_FILES[graph])
            ]
        for name in (TOKENIZER_FILE, RUNTIME_CONFIG_FILE):
            if name not in self.report["runtime_assets"]:
                raise UserError(f"export report {path} lists no {name}", RERUN_EXPORT)
            checks.append(FileCheck(self.member(name), self.report["runtime_assets"][name], RERUN_EXPORT))
        if variant != FP32_VARIANT:
            fix = variant_fix(variant)
            entry = self.listed_variants().get(variant)
            if entry is None:
                raise UserError(
                    f"export report {path} does not list variant {variant!r} (a folder left from an "
                    "earlier export, or made by hand?)",
                    fix,
                )
            problem = schema_problem(entry, VARIANT_SCHEMA, f"variants.{variant}")
            if problem:
                raise UserError(f"export report {path} is malformed: {problem}", fix)
            folder = variant_dir(self.dir, variant)
            checks += [
                FileCheck(confined(folder, name, f"export report {path}", fix), info, fix)
                for name, info in entry["files"].items()
            ]
        return checks

    def transformer_metadata(self, session: Any) -> dict[str, Any]:
        """The loaded transformer's metadata (graph_metadata), checked to name the bundle's variant."""
        path = self.transformer_path()
        meta = graph_metadata(session, path, "transformer")
        if meta.get("variant", FP32_VARIANT) != self.variant:
            raise UserError(
                f"{path} is variant {meta.get('variant', FP32_VARIANT)!r}, not {self.variant!r}",
                variant_fix(self.variant),
            )
        return meta

    def check_graphs(self, transformer: dict[str, Any], open_codec: Callable[[str], Any]) -> None:
        """The graphs a variant loads are one export's: each codec session (`open_codec(name)`) is
        an encoder/decoder graph (graph_metadata) of this variant or the export's own, of the
        transformer's model (`transformer`: transformer_metadata's) with its constants; and
        runtime-config.json says what the graphs say (a port reads the config, not the graphs).
        A UserError naming the stranger and the step that remakes it."""
        path = self.transformer_path()
        for name, codec_path in self.codec_paths(self.variant).items():
            meta = graph_metadata(open_codec(name), codec_path, name)
            if meta.get("variant", FP32_VARIANT) not in (FP32_VARIANT, self.variant):
                raise UserError(
                    f"{codec_path} is variant {meta['variant']!r}'s {name}, not {self.variant!r}'s",
                    variant_fix(self.variant),
                )
            if meta["model_fingerprint"] != transformer["model_fingerprint"]:
                if self.variant != FP32_VARIANT:  # the codecs are the export's own: the variant is the stranger
                    raise UserError(
                        f"{path} was made from another export (model {transformer['model_fingerprint'][:16]}; "
                        f"this export's graphs are of {meta['model_fingerprint'][:16]})",
                        variant_fix(self.variant),
                    )
                raise UserError(
                    f"{codec_path} belongs to another export (model {meta['model_fingerprint'][:16]}, the "
                    f"transformer's is {transformer['model_fingerprint'][:16]})",
                    RERUN_EXPORT,
                )
            differ = [key for key in INT_METADATA if meta[key] != transformer[key]]
            if differ:
                raise UserError(
                    f"{codec_path} says {differ[0]}={meta[differ[0]]} but {path} says {transformer[differ[0]]}",
                    RERUN_EXPORT,
                )
        config = self.runtime_config
        if config["graphs"] != contract_table():
            raise UserError(
                "runtime-config.json's graphs section is not this runtime's I/O contract (omnivoice_onnx.contract)",
                RERUN_EXPORT,
            )
        for key, meta_key in CONFIG_VS_METADATA.items():
            if config["model"][key] != transformer[meta_key]:
                raise UserError(
                    f"runtime-config.json says {key}={config['model'][key]} but the graphs say {transformer[meta_key]}",
                    RERUN_EXPORT,
                )

    def listed_variants(self) -> dict[str, Any]:
        """The report's `variants` section (empty without a report)."""
        return report_variants(self.report)


def report_variants(report: dict[str, Any] | None) -> dict[str, Any]:
    """An export report's `variants` section (read_report checked its type); empty without one."""
    return (report or {}).get("variants") or {}


def read_report(model_dir: Path) -> dict[str, Any]:
    """export-report.json; a UserError naming why when it is missing, unreadable, not a JSON object,
    or when a section the runtime reads has another shape (REPORT_SCHEMA)."""
    path = Folder(model_dir).report_path  # read_json refuses anything but an object of REPORT_SCHEMA's shape
    return cast("dict[str, Any]", read_json(path, "export report", f"{RERUN_EXPORT}, {SKIP}", schema=REPORT_SCHEMA))


def default_variant(model_dir: Path, report: dict[str, Any] | None, provider: str = "cpu") -> str:
    """The variant loaded from `model_dir` when none is named: the first of DEFAULT_VARIANT_ORDER
    whose graph is in the folder AND that the export report lists (a re-export writes a new report
    without variants, so a folder left from the previous export is never taken), on the CPU
    provider only (the fused kernel was measured on CPU); else "fp32" when its graph is there;
    else the first listed variant present (a folder holding one variant: a release of it)."""
    listed = report_variants(report)
    if provider != "cpu" or not listed:
        return FP32_VARIANT  # no readable report: the faithful graph, whose own checks then speak
    present = variants_present(model_dir)
    usable = [name for name in present if name == FP32_VARIANT or name in listed]
    return next((name for name in DEFAULT_VARIANT_ORDER if name in usable), usable[0] if usable else FP32_VARIANT)
