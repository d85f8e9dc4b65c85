"""`omnivoice-onnx pack` and `download` (omnivoice_onnx.fetch): a release archive of the tiny export,
served by a real HTTP server on loopback (interrupted and resumed, restarted, a wrong hash, a
truncated archive, members that reach outside the folder; and one that lies: an endless body, a
terabyte announced, a redirect to another scheme, a stalled body cut by SIGTERM), links and
special files planted beside --dir, a full tmpfs, and the real huggingface_hub reading a repo laid
out in its own cache format, offline, or refusing an id. Each ends with the same speech for a
seed as the original bundle, or with one line and nothing left behind (or a `.part` the line
says is kept, and why)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, Pipeline

from omnivoice_onnx import fetch, hub, resumable
from omnivoice_onnx.errors import UserError

SPEAK = ("speak", "Hello there.", "--seed", "7", "--num-step", "2", "--quiet")


def command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=300,
    )


def one_error_line(done: subprocess.CompletedProcess, fragment: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("omnivoice-onnx: error: ") and fragment in lines[0], lines[0]
    return lines[0]


def spoken(model_dir: str | Path, out: Path, env: dict[str, str] | None = None) -> bytes:
    done = command(*SPEAK, "--model-dir", model_dir, "--out", out, env=env)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


class Archives(http.server.BaseHTTPRequestHandler):
    """Serves `files` ({path: bytes}) with HTTP Range support; `cut` paths send only their first
    half on the first request (the whole length announced), `no_range` paths ignore Range. The
    liars: /endless (bytes until the client leaves, no length), /chunked (the same in chunked
    transfer), /terabyte (a Content-Length of 1 TB, then bytes), /stall (a length, 256 KiB, then
    nothing until `release` is set), /hold (no answer at all until `release` is set), and
    `redirects` ({path: Location}). A range past the end is a 416 naming the size, as real servers do."""

    files: dict[str, bytes] = {}
    cut: set[str] = set()
    no_range: set[str] = set()
    redirects: dict[str, str] = {}
    release = threading.Event()
    seen: list[tuple[str, str | None]] = []  # (path, Range header) of every request

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/hold":  # no answer at all until `release` is set
            self.seen.append((self.path, None))
            self.release.wait(60)
            self.close_connection = True
            return
        if self.path in ("/endless", "/chunked", "/terabyte", "/stall") or self.path in self.redirects:
            self.lie()
            return
        data = self.files.get(self.path)
        rng = self.headers.get("Range")
        self.seen.append((self.path, rng))
        if data is None:
            self.send_error(404)
            return
        start = int(rng.removeprefix("bytes=").rstrip("-")) if rng and self.path not in self.no_range else None
        if start is not None and start >= len(data):  # as nginx and S3 answer: the size it has
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = data[start or 0 :]
        self.send_response(206 if start is not None else 200)
        if start is not None:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in self.cut:
            self.cut.discard(self.path)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def lie(self) -> None:
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/chunked":
            self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
        elif self.path == "/terabyte":
            self.send_header("Content-Length", str(10**12))
        elif self.path == "/stall":
            self.send_header("Content-Length", str(10 << 20))
        self.end_headers()
        block = b"\0" * 65536
        try:
            if self.path == "/stall":
                self.wfile.write(block * 4)
                self.wfile.flush()
                self.release.wait(60)
                return
            for _ in range(1 << 16):  # 4 GiB at most: the client stops long before
                self.wfile.write(b"10000\r\n" + block + b"\r\n" if self.path == "/chunked" else block)
        except OSError:  # the client left: what every case here expects
            pass
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Archives)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def release(pipeline: Pipeline, tmp_path_factory) -> Path:
    """The tiny export's default variant packed by the command."""
    out = tmp_path_factory.mktemp("release") / "omnivoice.tar"
    done = command("pack", pipeline.onnx, "-o", out)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def original(pipeline: Pipeline, tmp_path_factory) -> bytes:
    return spoken(pipeline.onnx, tmp_path_factory.mktemp("original") / "a.wav")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def crafted(members: list[tuple[tarfile.TarInfo, bytes]], manifest_files: dict[str, dict]) -> bytes:
    """A tar whose first member is a well-formed manifest listing `manifest_files`, then `members`."""
    buffer = io.BytesIO()
    head = json.dumps(
        {
            "format": fetch.MANIFEST_FORMAT,
            "version": fetch.MANIFEST_VERSION,
            "variant": "fp32",
            "model_fingerprint": "sha256:0",
            "files": manifest_files,
        }
    ).encode()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(fetch.MANIFEST_FILE)
        info.size = len(head)
        archive.addfile(info, io.BytesIO(head))
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


@pytest.mark.slow
def test_pack_is_the_variant_with_its_hashes(pipeline: Pipeline, release: Path, tmp_path: Path) -> None:
    """The archive is the manifest, then exactly the files the variant loads, the report and the
    card, each as hashed; packing again gives the same bytes."""
    report = json.loads((pipeline.onnx / "export-report.json").read_text())
    with tarfile.open(release) as archive:
        names = archive.getnames()
        manifest = json.loads(archive.extractfile(fetch.MANIFEST_FILE).read())
        assert names == [fetch.MANIFEST_FILE, *hub.release_files(report, "fp32")]
        for name in names[1:]:
            data = archive.extractfile(name).read()
            assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert "omnivoice_transformer.onnx.data" in names and "README.md" in names and "tokenizer.json" in names
    again = tmp_path / "again.tar"
    done = command("pack", pipeline.onnx, "-o", again)
    assert done.returncode == 0 and again.read_bytes() == release.read_bytes()
    digest = hashlib.sha256(again.read_bytes()).hexdigest()
    assert done.stdout == f"{digest}  {again}\n"  # sha256sum's line: `sha256sum -c` checks it
    assert f"omnivoice-onnx download https://HOST/PATH/again.tar --sha256 {digest} --dir DIR" in done.stderr
    one_error_line(command("pack", pipeline.onnx, "--variant", "int8", "-o", tmp_path / "x.tar"), "int8")
    assert leftovers(tmp_path) == ["again.tar"]


@pytest.mark.slow
def test_download_interrupted_resumed_then_found_in_place(
    release: Path, server: str, original: bytes, tmp_path: Path
) -> None:
    """The first fetch is cut halfway: one line, the folder untouched, the part kept; the same
    command resumes it with a Range request, verifies it and speaks the same bytes; a third run
    fetches nothing."""
    data = release.read_bytes()
    Archives.files["/cut.tar"] = data
    Archives.cut.add("/cut.tar")
    digest = hashlib.sha256(data).hexdigest()
    target = tmp_path / "model"
    args = ("download", f"{server}/cut.tar", "--sha256", digest, "--dir", target)
    one_error_line(command(*args), "interrupted after")
    assert not target.exists() and [p for p in leftovers(tmp_path) if p.endswith(".part")]
    Archives.seen.clear()
    done = command(*args)
    assert done.returncode == 0, done.stderr
    assert Archives.seen == [("/cut.tar", f"bytes={len(data) // 2}-")]
    assert leftovers(tmp_path) == ["model"]
    assert spoken(target, tmp_path / "b.wav") == original
    Archives.seen.clear()
    done = command(*args)
    assert done.returncode == 0 and "nothing fetched" in done.stderr and Archives.seen == []


@pytest.mark.slow
def test_a_server_ignoring_ranges_restarts_cleanly(release: Path, server: str, tmp_path: Path) -> None:
    data = release.read_bytes()
    Archives.files["/plain.tar"] = data
    Archives.no_range.add("/plain.tar")
    target = tmp_path / "model"
    part = tmp_path / f".model.{hashlib.sha256(data).hexdigest()[:16]}.part"
    part.write_bytes(b"junk from an earlier try")
    done = command("download", f"{server}/plain.tar", "--sha256", hashlib.sha256(data).hexdigest(), "--dir", target)
    assert done.returncode == 0, done.stderr
    assert leftovers(tmp_path) == ["model"]


@pytest.mark.slow
def test_refusals_leave_nothing(release: Path, server: str, tmp_path: Path) -> None:
    """A wrong sha256, a truncated archive (with its own hash: what a bad upload gives) and an
    archive whose members reach outside the folder: one line each, nothing written, no .part kept."""
    data = release.read_bytes()
    Archives.files["/ok.tar"] = data
    Archives.files["/short.tar"] = data[: len(data) - 20_000]
    evil = b"pwned"
    entry = {"sha256": hashlib.sha256(evil).hexdigest(), "bytes": len(evil)}
    link = tarfile.TarInfo("link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    device = tarfile.TarInfo("dev")
    device.type = tarfile.CHRTYPE
    cases = {
        "/traversal.tar": ("../evil.txt", "a path outside the folder"),
        "/absolute.tar": ("/tmp/evil.txt", "a path outside the folder"),
        "/link.tar": (link, "a link"),
        "/device.tar": (device, "a device"),
    }
    for path, (member, _) in cases.items():
        if isinstance(member, str):
            info = tarfile.TarInfo(member)
            info.size = len(evil)
            member = info
        Archives.files[path] = crafted([(member, evil)], {member.name: entry})
    target = tmp_path / "sub" / "model"
    wrong = "0" * 64
    one_error_line(
        command("download", f"{server}/ok.tar", "--sha256", wrong, "--dir", target), f"not the {wrong} given"
    )
    short = Archives.files["/short.tar"]
    one_error_line(
        command("download", f"{server}/short.tar", "--sha256", hashlib.sha256(short).hexdigest(), "--dir", target),
        "short.tar",
    )
    for path, (_, fragment) in cases.items():
        body = Archives.files[path]
        one_error_line(
            command("download", f"{server}{path}", "--sha256", hashlib.sha256(body).hexdigest(), "--dir", target),
            fragment,
        )
    assert leftovers(tmp_path) == []  # not even the parent folder of --dir the runs made
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil.txt").exists()
    line = one_error_line(command("download", f"{server}/ok.tar", "--dir", target), "needs --sha256 HEX")
    assert "None" not in line and "`omnivoice-onnx pack` prints them" in line
    one_error_line(command("download", f"{server}/ok.tar", "--sha256", "abc", "--dir", target), "'abc' is not a sha256")


def test_oversized_and_unlisted_members_are_refused(tmp_path: Path) -> None:
    """A member whose header claims more than any file of this model is refused from its header
    (tarfile writes the header alone when given no data), and so is one the manifest does not list."""
    big = tarfile.TarInfo("big.bin")
    big.size = fetch.MAX_MEMBER_BYTES + 1
    archive = tmp_path / "a.tar"
    archive.write_bytes(crafted([], {}))
    with tarfile.open(archive, "a") as tar:
        tar.addfile(big)
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="larger than any file"), open(archive, "rb") as handle:
        fetch.extract(handle, tmp_path / "out", "a.tar")
    archive.write_bytes(crafted([(tarfile.TarInfo("extra.txt"), b"")], {}))
    with pytest.raises(UserError, match="does not list"), open(archive, "rb") as handle:
        fetch.extract(handle, tmp_path / "out", "a.tar")
    assert leftovers(tmp_path / "out") == []


def test_pack_without_a_report_under_verify_off(tmp_path: Path) -> None:
    """OMNIVOICE_VERIFY=0 opens a bundle without its report, but pack still needs it (it lists the
    files and their hashes): the refusal says so, rather than advising the OMNIVOICE_VERIFY=0 the
    user has already set, and no archive appears."""
    folder = tmp_path / "bundle"
    folder.mkdir()
    done = command("pack", folder, "-o", tmp_path / "out.tar", env={"OMNIVOICE_VERIFY": "0"})
    line = one_error_line(done, "cannot pack without the export report")
    assert "export report not found" in line and "does not skip the report for pack" in line
    assert not (tmp_path / "out.tar").exists()


def hub_cache(bundle: Path, cache: Path, repo: str) -> None:
    """`bundle`'s files as huggingface_hub lays out a downloaded repo: blobs named by hash,
    snapshots/<commit>/ linking to them, refs/main naming the commit."""
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        blob = root / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, blob)
        link = root / "snapshots" / commit / path.relative_to(bundle)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)


@pytest.mark.slow
def test_hugging_face_repo_offline(release: Path, original: bytes, tmp_path: Path) -> None:
    """The real huggingface_hub, HF_HUB_OFFLINE=1, a repo in its cache format: `download` copies
    and verifies the variant's files and speaks the same bytes; `--model-dir hf:ORG/NAME` reads the
    cache itself; a repo not in the cache is one line."""
    unpacked = tmp_path / "unpacked"
    with tarfile.open(release) as archive:
        archive.extractall(unpacked, filter="data")
    (unpacked / fetch.MANIFEST_FILE).unlink()  # a repo holds the bundle's files, nothing of the archive's
    cache = tmp_path / "hub"
    hub_cache(unpacked, cache, "someone/omnivoice-tiny")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf-home")}
    target = tmp_path / "model"
    done = command("download", "someone/omnivoice-tiny", "--dir", target, env=env)
    assert done.returncode == 0, done.stderr
    assert spoken(target, tmp_path / "b.wav") == original
    assert spoken("hf:someone/omnivoice-tiny", tmp_path / "c.wav", env=env) == original
    done = command("download", "someone/omnivoice-tiny", "--dir", target, env=env)
    assert done.returncode == 0 and "nothing fetched" in done.stderr
    # Saved voices of a hub model live in the user's data folder, never in the cache's snapshot.
    data = {**env, "XDG_DATA_HOME": str(tmp_path / "data")}
    done = command(
        "voice",
        "add",
        "calm",
        "--instruct",
        "female, low pitch",
        "--seed",
        "7",
        "--model-dir",
        "hf:someone/omnivoice-tiny",
        env=data,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "data" / "omnivoice-onnx" / "voices" / "someone" / "omnivoice-tiny" / "calm.json").is_file()
    assert not any(p.name in ("voices", "calm.json") for p in cache.rglob("*"))
    assert spoken_with("hf:someone/omnivoice-tiny", "calm", tmp_path / "d.wav", env=data)
    # The Hub unreachable, no offline mode: the cached repo is read at once (nothing retried).
    unreachable = {**env, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    started = time.monotonic()
    assert spoken("hf:someone/omnivoice-tiny", tmp_path / "e.wav", env=unreachable) == original
    assert time.monotonic() - started < 15, "retried"
    one_error_line(command("download", "someone/other", "--dir", tmp_path / "x", env=env), "not in the Hugging Face")
    one_error_line(
        command("download", "someone/omnivoice-tiny", "--dir", tmp_path / "x", "--variant", "int8", env=env),
        "no variant 'int8'",
    )
    assert not (tmp_path / "x").exists()


# --- round 6: planted links, lying servers, leftovers, hub ids ---------------------------------------


def nothing_beside(folder: Path, *kept: str) -> None:
    """`folder` holds `kept` and nothing else: no .part, lock, staging, .old or made parent left."""
    assert leftovers(folder) == sorted(kept), leftovers(folder)


@pytest.mark.parametrize("planted", ["part-link", "part-hardlink", "part-fifo", "lock-link", "lock-folder"])
def test_a_planted_link_or_special_file_beside_dir_is_never_written_through(
    planted: str, server: str, tmp_path: Path
) -> None:
    """What a download writes at a fixed name beside --dir (its `.part`, its `.lock`) is opened
    without following a link (files.open_regular): a symlink, a hard link to another file, a fifo
    or a folder planted there is one line naming it, the file it points at untouched."""
    data = b"archive bytes " * 1000
    Archives.files["/planted.tar"] = data
    digest = hashlib.sha256(data).hexdigest()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    name = f".model.{digest[:16]}.part" if planted.startswith("part") else ".model.lock"
    spot = tmp_path / name
    if planted.endswith("-link"):
        spot.symlink_to(victim)
    elif planted == "part-hardlink":
        os.link(victim, spot)
    elif planted == "part-fifo":
        os.mkfifo(spot)
    else:
        spot.mkdir()
    done = command("download", f"{server}/planted.tar", "--sha256", digest, "--dir", tmp_path / "model")
    kind = {"link": "a symbolic link", "hardlink": "a hard link", "fifo": "a fifo", "folder": "a folder"}
    one_error_line(done, kind[planted.split("-")[1]])
    assert victim.read_bytes() == b"precious"
    nothing_beside(tmp_path, "victim", name)


@pytest.mark.parametrize(
    "path,env,words",
    [
        ("/endless", {resumable.DOWNLOAD_LIMIT_ENV: "1000000"}, "sent more than 1,0"),
        ("/chunked", {resumable.DOWNLOAD_LIMIT_ENV: "1000000"}, "sent more than 1,0"),
        ("/terabyte", {}, "announces 1,000,000,000,000 bytes"),
        ("/missing.tar", {}, "HTTP 404"),
    ],
)
def test_endless_or_lying_bodies_stop_at_the_bound_and_leave_nothing(
    path: str, env: dict[str, str], words: str, server: str, tmp_path: Path
) -> None:
    """A body without end (no length, or chunked) stops at OMNIVOICE_MAX_DOWNLOAD_BYTES, a length
    over it is refused before a byte is written; a 404 too leaves nothing: no .part, and not the
    parent folders of --dir the run made."""
    target = tmp_path / "made" / "for" / "model"
    done = command("download", f"{server}{path}", "--sha256", "0" * 64, "--dir", target, env=env)
    line = one_error_line(done, words)
    assert "nothing was kept" in line or path == "/missing.tar", line
    nothing_beside(tmp_path)


def test_a_full_disk_leaves_no_part_and_no_lock(server: str, small_mount) -> None:
    """A tmpfs of 1 MiB: an endless body fills it (one line naming the .part, which goes); a disk
    already full fails on the lock's pid, which goes too."""
    disk = small_mount("1M")
    done = command("download", f"{server}/endless", "--sha256", "0" * 64, "--dir", disk / "model")
    one_error_line(done, "disk full while writing")
    nothing_beside(disk)
    with open(disk / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while filler.write(b"\0" * 4096):  # until ENOSPC: the disk is full
            pass
    done = command("download", f"{server}/endless", "--sha256", "0" * 64, "--dir", disk / "model")
    one_error_line(done, "disk full while writing")
    nothing_beside(disk, "filler")


@pytest.mark.parametrize("location", ["ftp://127.0.0.1:1/x.tar", "file:///etc/passwd"])
def test_a_redirect_to_another_scheme_is_refused_naming_where(location: str, server: str, tmp_path: Path) -> None:
    Archives.redirects["/moved.tar"] = location
    done = command("download", f"{server}/moved.tar", "--sha256", "0" * 64, "--dir", tmp_path / "model")
    line = one_error_line(done, f"redirects to '{location}', which is not an http(s) URL")
    assert f"{server}/moved.tar" in line
    nothing_beside(tmp_path)


def foreground_sigint() -> None:
    """In the child before exec: SIGINT as a terminal's foreground job gets it. A suite started in the
    background (`make test &`, nohup, some CI runners) ignores SIGINT, its children inherit that, and
    Python then installs no KeyboardInterrupt handler: Ctrl-C would not reach the download at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stopped(url: str, target: Path, signum: int, ready) -> tuple[int, str]:
    """`download url` into `target`, sent `signum` once `ready()`: (its exit code, its stderr)."""
    Archives.release.clear()
    process = subprocess.Popen(
        [sys.executable, "-m", "omnivoice_onnx", "download", url, "--sha256", "0" * 64, "--dir", str(target)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=foreground_sigint,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        Archives.release.set()
        if process.poll() is None:
            process.kill()
    return process.returncode, stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_keeps_the_partial_download_and_says_so(signum: int, server: str, tmp_path: Path) -> None:
    """SIGTERM or Ctrl-C while the body arrives: exit 143 or 130, and the last line says the `.part`
    is kept for the next run (it is: a resumable download), not that nothing half-written was kept."""
    part = tmp_path / f".model.{'0' * 16}.part"
    code, stderr = stopped(f"{server}/stall", tmp_path / "model", signum, lambda: part.exists() and part.stat().st_size)
    lines = stderr.strip().splitlines()
    said = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    assert code == 128 + signum and len(lines) == 1, stderr
    assert f"{said}: the partial download {part} (262,144 bytes) was kept: the same command resumes it" in lines[0]
    assert "nothing half-written" not in lines[0]
    nothing_beside(tmp_path, part.name)


def test_a_stop_before_any_byte_keeps_nothing_and_says_so(server: str, tmp_path: Path) -> None:
    """Ctrl-C while the server has not answered: the empty `.part` goes, and the line says nothing was kept."""
    Archives.seen.clear()
    code, stderr = stopped(
        f"{server}/hold", tmp_path / "model", signal.SIGINT, lambda: ("/hold", None) in Archives.seen
    )
    lines = stderr.strip().splitlines()
    assert code == 130 and lines == [
        "omnivoice-onnx: interrupted: nothing half-written was kept; earlier artefacts are intact"
    ], stderr
    nothing_beside(tmp_path)


@pytest.mark.slow
def test_a_stop_while_the_whole_archive_is_checked_keeps_it_and_the_rerun_fetches_nothing(
    release: Path, server: str, tmp_path: Path, monkeypatch
) -> None:
    """Ctrl-C once every byte arrived, while the archive is checked (hashed, extracted): the `.part`
    is kept, whole, and the line says so; the same download then asks for the bytes after it, the
    server's 416 names that size, and the archive is checked and installed without a byte more."""
    data = release.read_bytes()
    Archives.files["/whole.tar"] = data
    digest = hashlib.sha256(data).hexdigest()
    target, part = tmp_path / "model", tmp_path / f".model.{digest[:16]}.part"

    def stop(*args) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(fetch, "_install_archive", stop)
        with pytest.raises(KeyboardInterrupt) as stopped_by:
            fetch.download(f"{server}/whole.tar", target, sha256=digest)
    assert str(stopped_by.value) == resumable.kept_line(part, len(data))
    assert part.read_bytes() == data and not target.exists()
    Archives.seen.clear()
    manifest, fetched = fetch.download(f"{server}/whole.tar", target, sha256=digest)
    assert fetched and Archives.seen == [("/whole.tar", f"bytes={len(data)}-")]
    assert manifest["source"] == {"url_sha256": digest}
    nothing_beside(tmp_path, "model")


def test_progress_on_a_terminal_only(server: str, tmp_path: Path) -> None:
    """stderr a terminal (a pty): a progress line redrawn with `\\r` as the bytes arrive, then the
    error line on a line of its own; stderr a pipe: the one line alone. (The archive is not a
    release: what is measured is the fetch, which then ends at the hash check.)"""
    import pty
    import select

    data = os.urandom(3 << 20)
    Archives.files["/progress.tar"] = data
    url = f"{server}/progress.tar"
    args = [sys.executable, "-m", "omnivoice_onnx", "download", url, "--sha256", "0" * 64, "--dir", str(tmp_path / "m")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    leader, follower = pty.openpty()
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 1)[0]:
            try:
                block = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not block:
                break
            seen += block
        elif process.poll() is not None:
            break
    os.close(leader)
    assert process.wait(timeout=60) == 2
    text = seen.decode()
    assert "\rprogress.tar: 3.0 of 3.0 MiB (100%), " in text and " MiB/s" in text, text
    last = text.replace("\r\n", "\n").rstrip("\n").split("\n")[-1]
    assert last.startswith("omnivoice-onnx: error: the archive at ") and "\r" not in last, text
    piped = command("download", url, "--sha256", "0" * 64, "--dir", tmp_path / "m")
    assert "MiB/s" not in piped.stderr and "\r" not in piped.stderr
    one_error_line(piped, "not the " + "0" * 64 + " given")


@pytest.mark.slow
def test_an_upgrade_in_place_keeps_the_saved_voices(
    release: Path, server: str, original: bytes, tmp_path: Path
) -> None:
    """A bundle downloaded into DIR, a voice saved in DIR/voices (the default folder): another
    archive downloaded over it replaces the bundle and carries the voice along (the same file,
    spoken the same); a refused download over it leaves bundle and voice as they were; a file of
    the user's elsewhere in DIR is still refused, not removed."""
    data = release.read_bytes()
    Archives.files["/v1.tar"] = data
    Archives.files["/v2.tar.gz"] = gzip.compress(data)  # another archive of the same bundle: another source
    target = tmp_path / "model"
    done = command("download", f"{server}/v1.tar", "--sha256", hashlib.sha256(data).hexdigest(), "--dir", target)
    assert done.returncode == 0, done.stderr
    done = command("voice", "add", "calm", "--instruct", "female, low pitch", "--seed", "7", "--model-dir", target)
    assert done.returncode == 0, done.stderr
    voice = (target / "voices" / "calm.json").read_bytes()
    before = spoken_with(target, "calm", tmp_path / "a.wav")
    gz = hashlib.sha256(Archives.files["/v2.tar.gz"]).hexdigest()
    one_error_line(command("download", f"{server}/v2.tar.gz", "--sha256", "1" * 64, "--dir", target), "given")
    assert (target / "voices" / "calm.json").read_bytes() == voice
    done = command("download", f"{server}/v2.tar.gz", "--sha256", gz, "--dir", target)
    assert done.returncode == 0, done.stderr
    assert json.loads((target / fetch.MANIFEST_FILE).read_text())["source"] == {"url_sha256": gz}
    assert (target / "voices" / "calm.json").read_bytes() == voice
    assert spoken_with(target, "calm", tmp_path / "b.wav") == before
    (target / "notes.txt").write_text("mine")
    one_error_line(
        command("download", f"{server}/v1.tar", "--sha256", hashlib.sha256(data).hexdigest(), "--dir", target),
        "holds notes.txt",
    )
    assert (target / "notes.txt").read_text() == "mine" and (target / "voices" / "calm.json").read_bytes() == voice
    nothing_beside(tmp_path, "a.wav", "b.wav", "model")


def spoken_with(model_dir: str | Path, voice: str, out: Path, env: dict[str, str] | None = None) -> bytes:
    done = command(
        "speak",
        "Hello there.",
        "--voice",
        voice,
        "--num-step",
        "2",
        "--quiet",
        "--model-dir",
        model_dir,
        "--out",
        out,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_hub_is_one_line_at_once(tmp_path: Path) -> None:
    """A repo not in the cache while the Hub cannot be reached (HF_ENDPOINT a closed port), no
    offline mode set: one line naming the Hub unreachable and the ways on, in seconds (huggingface_hub
    alone retries ~24 s, then blames an offline mode), for `download` and --model-dir hf: alike."""
    env = {
        "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_OFFLINE": "0",
    }
    for args in (
        ("download", "someone/omnivoice-tiny", "--dir", tmp_path / "x"),
        (*SPEAK, "--model-dir", "hf:someone/omnivoice-tiny", "--out", tmp_path / "a.wav"),
    ):
        started = time.monotonic()
        line = one_error_line(command(*args, env=env), "is unreachable (")
        assert time.monotonic() - started < 15, "retried"  # a run is ~1 s; huggingface_hub's retries ~24 s
        assert "HF_HUB_OFFLINE=1" in line and "--sha256" in line and "--model-dir DIR" in line
        assert "offline: " not in line
    assert not (tmp_path / "x").exists() and not (tmp_path / "a.wav").exists()


HUB_REFUSED = ["a..b/c", "org/na..me", "a--b/c", "org/name.", "org./name", "org/-name", "org/name.git", "o/" + "n" * 97]


def test_the_hub_id_check_agrees_with_huggingface_hub() -> None:
    """hub.HF_REPO_ID accepts an ORG/NAME exactly when huggingface_hub's own validator does."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    for repo in [*HUB_REFUSED, "org/name", "Org_1/name-2.b", "_a/b_", "o/" + "n" * 96, "org/name.gitx", "a/b/c"]:
        try:
            validate_repo_id(repo)
            accepted = True
        except HFValidationError:
            accepted = False
        assert bool(hub.HF_REPO_ID.fullmatch(repo)) == accepted, repo


def test_hub_ids_huggingface_refuses_are_one_line(tmp_path: Path, monkeypatch) -> None:
    """Ids that pass a loose ORG/NAME pattern but that huggingface_hub refuses (its HFValidationError
    was a traceback): refused by the one check, for `download` and --model-dir hf: alike, before
    anything is made; from the command line one line and exit 2, a bad --revision too."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "hf-home")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for repo in HUB_REFUSED:
        with pytest.raises(UserError, match="not a Hugging Face repo id"):
            fetch.download(repo, tmp_path / "x" / "model")
        with pytest.raises(UserError, match="not a Hugging Face repo id"):
            hub.resolve_model_dir(f"hf:{repo}")
    one_error_line(command("download", "a..b/c", "--dir", tmp_path / "x" / "model", env=env), "not a Hugging Face")
    one_error_line(
        command(*SPEAK, "--model-dir", "hf:org/name.", "--out", tmp_path / "a.wav", env=env), "not a Hugging Face"
    )
    one_error_line(
        command("download", "org/name", "--revision", "../main", "--dir", tmp_path / "x", env=env),
        "not a branch, tag or commit name",
    )
    nothing_beside(tmp_path)


@pytest.mark.slow
def test_a_linked_dir_is_the_folder_it_names_and_refusals_keep_no_part(
    release: Path, server: str, original: bytes, tmp_path: Path
) -> None:
    """--dir a link to a folder: the bundle lands in that folder, the link stays, nothing is left
    beside either (an `.old` of a fixed name planted as a link is neither restored nor followed).
    A refused variant keeps no `.part` of the (verified) archive: the line says nothing was kept."""
    data = release.read_bytes()
    Archives.files["/linked.tar"] = data
    digest = hashlib.sha256(data).hexdigest()
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / ".real.old-999999999").symlink_to(victim)  # a pid no process has: "stale"
    Archives.files["/linked.tar.gz"] = gzip.compress(data)  # another archive of the same bundle
    for url, sha in ((f"{server}/linked.tar", digest), (f"{server}/linked.tar.gz", None)):
        sha = sha or hashlib.sha256(Archives.files["/linked.tar.gz"]).hexdigest()
        done = command("download", url, "--sha256", sha, "--dir", link)  # the second replaces the first
        assert done.returncode == 0, done.stderr
    assert link.is_symlink() and spoken(link, tmp_path / "b.wav") == original
    (tmp_path / "b.wav").unlink()
    nothing_beside(tmp_path, "link", "real", "victim")
    assert leftovers(victim) == []
    done = command("download", f"{server}/linked.tar", "--sha256", digest, "--dir", tmp_path / "m", "--variant", "int8")
    one_error_line(done, "not int8")
    nothing_beside(tmp_path, "link", "real", "victim")
