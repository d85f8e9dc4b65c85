"""A bundle on the Hugging Face Hub: which files of a variant a release carries, read through
huggingface_hub's cache, and where the voices of a hub model live.

    hub_snapshot("ORG/NAME", "int8")          # (the cache's snapshot folder, the variant)
    resolve_model_dir("hf:ORG/NAME", "int8")  # --model-dir hf:ORG/NAME
    hub_voices_dir("ORG/NAME")                # its saved voices: outside the cache

What a variant needs is derived, never listed by hand: the files Bundle.file_checks names for it
(its transformer, the codec graphs, tokenizer.json, runtime-config.json), plus the export report
and the model card; omnivoice_onnx.fetch packs and downloads the same list.

huggingface_hub retries a file it cannot reach for ~24 s before it says the cache lacks it (and
names an offline mode nobody set): a repo not in the cache is asked of the Hub once first, and an
unreachable Hub is one line at once naming the ways on. A snapshot folder belongs to the cache
(replaced by the next revision, removed by `hf cache delete`): a hub model's saved voices live
in the user's data folder instead (hub_voices_dir).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnivoice_onnx.bundle import DEFAULT_VARIANT_ORDER, MODEL_CARD_FILE, Bundle, Folder, read_report, report_variants
from omnivoice_onnx.contract import FP32_VARIANT, REPORT_FILE
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import HF_REPO_FIX, HF_REPO_ID
from omnivoice_onnx.verified import CACHE_SUBDIR

HF_PREFIX = "hf:"  # --model-dir hf:ORG/NAME (__main__.resolve_hub_model_dirs looks for it)
# A --revision: a branch, tag or commit as git names them (git check-ref-format's main rules).
REVISION = re.compile(r"(?!.*(?:\.\.|@\{|//))(?!/)(?!.*[/.]$)(?!.*\.lock(?:/|$))[^\x00-\x20\x7f~^:?*\[\\]{1,256}")
# The libraries huggingface_hub has made its requests with (0.x requests, 1.x httpx, 2.x httpx2):
# an error of theirs while asking the Hub is the Hub not answering (refused, timed out, no route).
HTTP_LIBRARIES = ("requests", "urllib3", "httpx", "httpx2", "httpcore")
OFFLINE_ENV = "HF_HUB_OFFLINE"
DATA_HOME_ENV = "XDG_DATA_HOME"  # hub voices: $XDG_DATA_HOME/omnivoice-onnx/voices/ORG/NAME
UNREACHABLE_FIX = (
    "pass a bundle folder on this machine (--model-dir DIR), or one downloaded earlier; set "
    f"{OFFLINE_ENV}=1 to use what the Hugging Face cache holds; or download a release archive "
    "(omnivoice-onnx download URL --sha256 HEX --dir DIR); else check the network or HF_ENDPOINT"
)


def release_files(report: dict[str, Any], variant: str) -> list[str]:
    """The names, relative to a bundle, of what `variant` needs: what Bundle.file_checks checks
    (its transformer, the codecs, the runtime assets), then the report and the model card."""
    if variant != FP32_VARIANT and variant not in report_variants(report):
        raise UserError(
            f"the bundle has no variant {variant!r} (it has: {', '.join([FP32_VARIANT, *report_variants(report)])})",
            "pass --variant one of those",
        )
    root = Path("/bundle")  # file_checks names paths; none is opened
    names = [check.path.relative_to(root).as_posix() for check in Bundle(root, variant, report).file_checks()]
    return names + [REPORT_FILE, MODEL_CARD_FILE]


def default_release_variant(report: dict[str, Any]) -> str:
    """The variant a download takes when none is named: the runtime's default order among those
    the report lists (bundle.default_variant, without a folder to look in)."""
    listed = report_variants(report)
    return next((name for name in DEFAULT_VARIANT_ORDER if name == FP32_VARIANT or name in listed), FP32_VARIANT)


def check_hub_repo(repo: str, what: str) -> str:
    """`repo` if it is a Hugging Face repo id ORG/NAME that huggingface_hub accepts (HF_REPO_ID),
    else one line naming `what`: the one check of a repo id, for `download` and `--model-dir hf:`."""
    if not HF_REPO_ID.fullmatch(repo):
        raise UserError(f"{what} {repo!r:.120} is not a Hugging Face repo id ORG/NAME", HF_REPO_FIX)
    return repo


def check_revision(revision: str | None) -> str | None:
    """`revision` if it is None or a name git and the Hub accept (REVISION), else one line."""
    if revision is not None and not REVISION.fullmatch(revision):
        raise UserError(
            f"--revision {revision!r:.120} is not a branch, tag or commit name",
            "pass a branch, tag or commit as the Hub shows it (no spaces, '..', '~', '^', ':' or control characters)",
        )
    return revision


def _unreachable(repo: str, exc: BaseException) -> UserError:
    from huggingface_hub import constants

    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return UserError(
        f"the Hugging Face Hub ({constants.ENDPOINT}) is unreachable ({reason:.160}) and the cache "
        f"lacks files of {repo}",
        UNREACHABLE_FIX,
    )


def _transport_error(exc: BaseException) -> bool:
    """`exc` is the Hub not answering: an OSError, or an error of the HTTP library huggingface_hub uses."""
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in HTTP_LIBRARIES


@contextlib.contextmanager
def _hub_errors(repo: str, offline: bool) -> Iterator[None]:
    """huggingface_hub's errors as one line each; `offline`: the cache alone was asked (the line
    names what made it so)."""
    from huggingface_hub import errors

    try:
        yield
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM mid-fetch: the run's last line says what stays
        raise type(exc)(
            f"huggingface_hub keeps what it had fetched of {repo} in its cache (HF_HUB_CACHE): the same "
            "command resumes it"
        ) from None
    except errors.LocalEntryNotFoundError as exc:
        if not offline:  # the Hub stopped answering after the first question: the cause says why
            raise _unreachable(repo, exc.__cause__ or exc.__context__ or exc) from None
        raise UserError(
            f"{repo} is not in the Hugging Face cache, and {OFFLINE_ENV} or --local-files-only keeps the network out",
            f"run once without {OFFLINE_ENV}=1 and --local-files-only, or pass another cache (HF_HUB_CACHE)",
        ) from None
    except errors.RepositoryNotFoundError:
        raise UserError(
            f"Hugging Face repo {repo} not found (or private)", "check ORG/NAME, or log in (hf auth login)"
        ) from None
    except errors.RevisionNotFoundError:
        raise UserError(
            f"{repo} has no such revision", "pass an existing --revision (a branch, tag or commit)"
        ) from None
    except errors.EntryNotFoundError as exc:
        raise UserError(
            f"{repo} lacks a file a bundle needs ({exc})", "it is not an omnivoice-onnx bundle repo"
        ) from None
    except errors.HfHubHTTPError as exc:
        raise UserError(
            f"the Hugging Face Hub refused {repo} ({str(exc).splitlines()[0]})", "run again later"
        ) from None


def _ask_once(repo: str, revision: str | None) -> None:
    """When the cache lacks the report, ask the Hub for it once, without retries: an unreachable Hub
    is one line now, not after huggingface_hub's ~24 s of retries. A cached report needs no
    question (huggingface_hub falls back to it at once)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo, REPORT_FILE, revision=revision), str):
        return
    try:
        get_hf_file_metadata(hf_hub_url(repo, REPORT_FILE, revision=revision))
    except Exception as exc:  # the hub's own errors are _hub_errors'; a transport's is the Hub unreachable
        if _transport_error(exc):
            raise _unreachable(repo, exc) from None
        raise


def hub_snapshot(
    repo: str, variant: str | None = None, local_files_only: bool = False, revision: str | None = None
) -> tuple[Path, str]:
    """`variant`'s files of the Hugging Face repo `repo` in the huggingface_hub cache, only
    those (release_files of the repo's export report); (the snapshot folder, the variant)."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download

    check_hub_repo(repo, "the Hugging Face repo id")
    check_revision(revision)
    offline = local_files_only or bool(constants.HF_HUB_OFFLINE)
    with _hub_errors(repo, offline):
        if not offline:
            _ask_once(repo, revision)
        report_path = hf_hub_download(repo, REPORT_FILE, revision=revision, local_files_only=local_files_only)
        report = read_report(Path(report_path).parent)
        variant = variant or default_release_variant(report)
        names = release_files(report, variant)
        folder = Path(
            snapshot_download(repo, revision=revision, allow_patterns=names, local_files_only=local_files_only)
        )
    missing = [name for name in names if not Folder(folder).member(name).is_file()]
    if missing:
        raise UserError(
            f"Hugging Face repo {repo} lacks {missing[0]} (variant {variant})",
            "name a variant the repo holds (--variant), or check the repo",
        )
    return folder, variant


def hub_repo(model_dir: str | os.PathLike[str]) -> str | None:
    """The repo id of a `hf:ORG/NAME` --model-dir (checked), else None."""
    text = os.fspath(model_dir)
    return check_hub_repo(text.removeprefix(HF_PREFIX), "--model-dir hf:") if text.startswith(HF_PREFIX) else None


def resolve_model_dir(
    model_dir: str | os.PathLike[str], variant: str | None = None, local_files_only: bool = False
) -> Path:
    """`model_dir` as a folder: itself, or for `hf:ORG/NAME` the huggingface_hub snapshot of the
    variant's files (fetched unless cached; HF_HUB_OFFLINE honoured). The files are checked when
    the bundle opens, as any folder's are."""
    repo = hub_repo(model_dir)
    return Path(model_dir) if repo is None else hub_snapshot(repo, variant, local_files_only)[0]


def hub_voices_dir(repo: str) -> Path | None:
    """Where the saved voices of the hub model `repo` live when neither --voices nor
    $OMNIVOICE_VOICES names a folder: $XDG_DATA_HOME/omnivoice-onnx/voices/ORG/NAME (an absolute
    one: the XDG spec ignores a relative value), else ~/.local/share/omnivoice-onnx/voices/ORG/NAME;
    None without a home folder. Never the cache's snapshot folder, which the next revision or a
    cache clean-up replaces."""
    base = os.environ.get(DATA_HOME_ENV, "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")  # "~" itself when no home can be found
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".local", "share")
    return Path(base, CACHE_SUBDIR, "voices", *repo.split("/"))
