"""Session fixtures: the tiny checkpoint is built once, steps 0-2 run once into a temporary tree.

Tests call the scripts' main() in-process where they check results (fast: no re-import of
torch), and run them as subprocesses where they check exit codes and stderr lines.

`make test` runs the files on two pytest-xdist workers (`-n 2 --dist loadfile`: a file's module
fixtures stay in one process). The expensive session artefacts (steps 0-2, the extra exports) are
built once per run, by the first worker that needs them, into the run's shared temporary
directory under a file lock (`shared_build`); the other worker waits for them and reads them.
"""

from __future__ import annotations

import os

# One intra-op thread per process, set before torch is imported and inherited by every script the
# tests run: two xdist workers on two cores would otherwise run a pool of one spinning thread per
# core each, and on the tiny graphs that spinning costs more than the work (investigation log: step 6 on
# tiny takes 51 CPU-s on two threads, 23 on one, and less wall time). Tests check results, never
# speed, and an explicit --threads still wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMNIVOICE_ORT_THREADS", "1")

import atexit
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from filelock import FileLock

REPO = Path(__file__).resolve().parent.parent
# Tests never read or write the user's cache (omnivoice_onnx.verified.VerifiedFiles' record): every
# test process, and every process it starts, uses its own, removed at exit.
os.environ["OMNIVOICE_CACHE_DIR"] = tempfile.mkdtemp(prefix="omnivoice-test-cache-")
atexit.register(shutil.rmtree, os.environ["OMNIVOICE_CACHE_DIR"], True)
sys.path.insert(0, str(REPO))

from omnivoice_export.step0_checkpoints.checkpoints import ensure_built, load_omnivoice, model_fingerprint  # noqa: E402
from omnivoice_export.step2_export import exporting, model_card, report, wrappers  # noqa: E402
from omnivoice_onnx.contract import GRAPH_FILES  # noqa: E402
from omnivoice_onnx.files import write_json_atomic  # noqa: E402


@dataclass
class Pipeline:
    """Paths of one tiny run of steps 0-2."""

    model: Path
    capture: Path
    onnx: Path
    export_stderr: str = ""  # what step 2 printed on stderr, run as a user runs it


def shared_build(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """Directory `name`, built by `build(path)` once per test run whichever xdist worker asks first
    (the others block on the lock until it is done), then read-only. A build that failed leaves no
    done-marker, so the next worker to ask retries it and fails the same way, with its own error."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # xdist gives each worker <run basetemp>/popen-gwN
    path, done = root / "shared" / name, root / "shared" / f"{name}.done"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            done.touch()
    return path


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny checkpoint, from the git-ignored cache (built on first use)."""
    return ensure_built("tiny")


@pytest.fixture(scope="session")
def pipeline(tiny_model: Path, tmp_path_factory) -> Pipeline:
    """Steps 0, 1 (all modes, all 32 steps) and 2 (dynamo) on tiny. Tests must not modify it:
    copy it first (see `pipeline_copy`). Step 2 runs as a subprocess, so that its stderr is what
    a user sees."""
    import capture_reference
    import make_reference

    def build(root: Path) -> None:
        make_reference.main(["--model", str(tiny_model), "--out-dir", str(root / "capture")])
        capture_reference.main(["--model", str(tiny_model), "--capture-dir", str(root / "capture")])
        (root / "export-stderr.txt").write_text(export_as_user(tiny_model, root / "capture", root / "onnx"))

    root = shared_build(tmp_path_factory, "pipeline", build)
    return Pipeline(tiny_model, root / "capture", root / "onnx", (root / "export-stderr.txt").read_text())


def export_as_user(model: Path, capture: Path, onnx: Path, *flags: str) -> str:
    """Step 2 as a subprocess (asserted to succeed); its stderr."""
    done = run_script(
        "export_omnivoice.py",
        "--model",
        str(model),
        "--capture-dir",
        str(capture),
        "--onnx-dir",
        str(onnx),
        *flags,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.fixture(scope="session")
def legacy_export(pipeline: Pipeline, tmp_path_factory) -> Pipeline:
    """The three graphs exported with the legacy (TorchScript) exporter from the session capture,
    into their own directory (stderr kept). Read-only."""

    def build(root: Path) -> None:
        (root / "export-stderr.txt").write_text(
            export_as_user(pipeline.model, pipeline.capture, root / "onnx", "--no-dynamo")
        )

    root = shared_build(tmp_path_factory, "legacy", build)
    return Pipeline(pipeline.model, pipeline.capture, root / "onnx", (root / "export-stderr.txt").read_text())


def copy_pipeline(pipeline: Pipeline, root: Path) -> Pipeline:
    """Copy capture/ and onnx/ of `pipeline` under `root`: onnx/ as real copies (tests damage graphs
    in place, and onnx refuses a sidecar reached through a link); capture/'s files as symlinks
    (~650 MB on tiny, read-only inputs: every script replaces a file by rename, never writes into
    one, so a new or rewritten file in the copy stays the copy's; a test that must damage a
    capture file replaces it the same way). A write through a link would change the shared
    capture, and every later reader would refuse it by its manifest sha256, loudly. Symlinks, not
    hard links: a hard link changes the shared files' ctime, so every worker's verification record
    would hash the whole capture again after each copy (investigation log)."""
    capture, onnx = root / "capture", root / "onnx"
    shutil.copytree(pipeline.capture, capture, copy_function=os.symlink)
    shutil.copytree(pipeline.onnx, onnx)
    return Pipeline(pipeline.model, capture, onnx)


# The variants most tests that run one need (step 5 on the session export): int8 (calibrated on
# the capture, the costliest recipe to build) and the fp32 graphs the runtime may default to.
SHARED_VARIANTS = ("int8", "fp32-unmasked", "fp32-fused")


@pytest.fixture(scope="session")
def variants_export(pipeline: Pipeline, tmp_path_factory) -> Path:
    """The session export with SHARED_VARIANTS built by quantize_omnivoice.py, once per test run
    whichever worker asks first (read-only: copy it before changing anything)."""
    import quantize_omnivoice

    def build(root: Path) -> None:
        shutil.copytree(pipeline.onnx, root / "onnx")
        quantize_omnivoice.main(["--onnx-dir", str(root / "onnx"), "--variants", ",".join(SHARED_VARIANTS)])

    return shared_build(tmp_path_factory, "variants-export", build) / "onnx"


@pytest.fixture
def pipeline_copy(pipeline: Pipeline, tmp_path: Path) -> Pipeline:
    """A private copy of the session pipeline's capture/ and onnx/, safe to damage."""
    return copy_pipeline(pipeline, tmp_path)


@pytest.fixture
def onnx_copy(pipeline: Pipeline, tmp_path: Path) -> Path:
    """A private copy of the session export only (~45 MB, against ~650 MB for the capture).

    For steps that only read the capture (parity_check.py): pair it with `pipeline.capture`.
    infer_onnx.py writes into its capture directory, so it needs `pipeline_copy`.
    """
    onnx = tmp_path / "onnx"
    shutil.copytree(pipeline.onnx, onnx)
    return onnx


@pytest.fixture(scope="session")
def torch_model(tiny_model: Path):
    """The tiny OmniVoice loaded once through from_pretrained; tests must not change its weights."""
    return load_omnivoice(tiny_model)


@pytest.fixture(scope="session")
def assets(tiny_model: Path, tmp_path_factory) -> Path:
    """tokenizer.json and runtime-config.json of the tiny checkpoint (runtime_assets alone, no export)."""
    from omnivoice_export.step2_export.runtime_assets import write_runtime_assets

    out = tmp_path_factory.mktemp("runtime_assets")
    write_runtime_assets(tiny_model, out)
    return out


@pytest.fixture(scope="session")
def config(assets: Path) -> dict:
    """The runtime-config.json a port reads, loaded (and type-checked) by the runtime."""
    from omnivoice_onnx.runtime_config import load_runtime_config

    return load_runtime_config(assets / "runtime-config.json")


@pytest.fixture(scope="session")
def tokenizer(assets: Path):
    from omnivoice_onnx.core.prompt import TextTokenizer

    return TextTokenizer.from_file(assets / "tokenizer.json")


def read_report(onnx_dir: Path) -> dict:
    """The export report as JSON, read without the package's validation (tests judge it)."""
    return json.loads(report.report_path(onnx_dir).read_text())


def install_graph(source_dir: Path, onnx_dir: Path, graph: str) -> None:
    """Copy `graph`'s .onnx and sidecar from `source_dir` over those in `onnx_dir`, and record their
    sha256/bytes in its report, as a faulty exporter would have: the integrity checks then pass and
    only the parity metrics can catch the fault."""
    name = GRAPH_FILES[graph]
    for file in (name, name + ".data"):
        shutil.copyfile(source_dir / file, onnx_dir / file)
    rehash_graph(onnx_dir, graph)


def rehash_graph(onnx_dir: Path, graph: str) -> None:
    """Record the sha256/bytes of `graph`'s files as they are now in its report entry."""
    data = read_report(onnx_dir)
    data["graphs"][graph]["files"] = report.graph_files(onnx_dir, graph)
    write_json_atomic(report.report_path(onnx_dir), data)


def single_stderr_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a failed script must print on stderr (asserted), for tests to inspect."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{proc.stderr}"
    return lines[0]


class CausalTransformerWrapper(wrappers.TransformerWrapper):
    """The defect the bidirectionality probe exists for (facts sheet: a causal attention kernel
    gave 18% token agreement): each query attends only to keys at or before it."""

    def forward(self, input_ids: torch.Tensor, audio_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = attention_mask.shape[-1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).tril()
        return super().forward(input_ids, audio_mask, attention_mask & causal)


def export_wrong_transformer(pipeline: Pipeline, module: torch.nn.Module, out: Path) -> None:
    """An export of `module` (a transformer wrapper) into `out`, with the real export's metadata
    (same exporter, opset, fingerprint): a wrong graph that passes every integrity check. Exported
    by the legacy TorchScript exporter, which computes the module's function as dynamo's graph does
    and costs an eighth of its time on tiny (investigation log); the metadata names dynamo, as the
    report does, so only the numbers can give the graph away."""
    import export_omnivoice
    from omnivoice_export.step1_capture import capture

    example, _ = export_omnivoice.transformer_examples(pipeline.capture, capture.load_manifest(pipeline.capture))
    exporting.export_graph(module.eval(), "transformer", example, out, dynamo=False, opset=exporting.DEFAULT_OPSET)
    config = json.loads((pipeline.model / "config.json").read_text())
    exporting.set_metadata(
        out / GRAPH_FILES["transformer"],
        "transformer",
        exporting.graph_metadata(
            "transformer",
            config,
            model_fingerprint(pipeline.model),
            "dynamo",
            exporting.DEFAULT_OPSET,
            report.package_versions(),
            model_card.provenance(pipeline.model),
        ),
    )


@pytest.fixture(scope="session")
def causal_transformer(pipeline: Pipeline, torch_model, tmp_path_factory) -> Path:
    """A directory holding the export of CausalTransformerWrapper (export_wrong_transformer).
    Read-only: install it into a copy with `install_graph`."""
    return shared_build(
        tmp_path_factory,
        "causal",
        lambda out: export_wrong_transformer(pipeline, CausalTransformerWrapper(torch_model), out),
    )


@pytest.fixture(scope="session")
def mask_ignoring_transformer(pipeline: Pipeline, tmp_path_factory) -> Path:
    """A directory holding the export of the tiny model loaded with `eager` attention
    (export_wrong_transformer): the defect of a graph that ignores the attention mask (eager adds
    the bool mask to the scores as 0/1, facts sheet), which the bidirectionality probe cannot see.
    Read-only: install it into a copy with `install_graph`."""

    def build(out: Path) -> None:
        model = load_omnivoice(pipeline.model)
        model.llm.set_attn_implementation("eager")
        export_wrong_transformer(pipeline, wrappers.make_wrappers(model)["transformer"], out)

    return shared_build(tmp_path_factory, "mask-ignoring", build)


def scaled_graph(source_dir: Path, graph: str, initializer: str, scale: float, out: Path) -> Path:
    """`graph` of `source_dir` re-saved into `out` with one named weight scaled (metadata kept),
    with one sidecar as the exporter writes it: a wrong graph that passes every integrity check."""
    import onnx
    from onnx import numpy_helper

    name = GRAPH_FILES[graph]
    model = onnx.load(str(source_dir / name))
    (weight,) = [init for init in model.graph.initializer if init.name == initializer]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(scale), initializer))
    report.save_with_sidecar(model, out / name)
    return out


@pytest.fixture(scope="session")
def perturbed_encoder(pipeline: Pipeline, tmp_path_factory) -> Path:
    """The session's encoder with its acoustic encoder's last conv scaled by 1.5: the latents the
    quantizer reads move, and some codes with them. Read-only: install it with `install_graph`."""
    return scaled_graph(
        pipeline.onnx,
        "encoder",
        "audio_tokenizer.acoustic_encoder.conv2.weight",
        1.5,
        tmp_path_factory.mktemp("perturbed-encoder"),
    )


@pytest.fixture(scope="session")
def perturbed_decoder(pipeline: Pipeline, tmp_path_factory) -> Path:
    """The session's decoder with its final conv scaled by 1.5: the waveform's level changes.
    Read-only: install it with `install_graph`."""
    return scaled_graph(
        pipeline.onnx,
        "decoder",
        "audio_tokenizer.acoustic_decoder.conv2.weight",
        1.5,
        tmp_path_factory.mktemp("perturbed-decoder"),
    )


AUDIO_HEAD_SCALE = 1.5


@pytest.fixture(scope="session")
def perturbed_transformer(pipeline: Pipeline, tmp_path_factory) -> Path:
    """A directory holding the session's transformer graph with its audio-heads weight scaled by
    AUDIO_HEAD_SCALE (metadata kept), saved with one sidecar as the exporter does: a subtly wrong
    graph (every logit x1.5, argmax unchanged). Read-only: install it with `install_graph`."""
    import onnx
    from onnx import numpy_helper

    out = tmp_path_factory.mktemp("perturbed")
    name = GRAPH_FILES["transformer"]
    model = onnx.load(str(pipeline.onnx / name))
    matmul_inputs = {value for node in model.graph.node if node.op_type == "MatMul" for value in node.input}
    # audio_heads: the MatMul weight [hidden, 8 * 1025] (dynamo names it val_N, so found by shape).
    heads = [
        init for init in model.graph.initializer if init.name in matmul_inputs and list(init.dims)[-1:] == [8 * 1025]
    ]
    assert len(heads) == 1, f"expected one audio_heads MatMul weight, found {[h.name for h in heads]}"
    scaled = numpy_helper.to_array(heads[0]) * np.float32(AUDIO_HEAD_SCALE)
    heads[0].CopyFrom(numpy_helper.from_array(scaled, heads[0].name))
    report.save_with_sidecar(model, out / name)
    assert sorted(os.listdir(out)) == [name, name + ".data"]
    return out


def run_script(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a pipeline script as a user would; returns the completed process (never raises)."""
    return subprocess.run(
        [sys.executable, str(REPO / script), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def import_blocker(modules) -> str:
    """Python source that makes the top-level `modules` unimportable in the interpreter running it:
    the prelude of a `python -c` script, so that a lazy import inside a function fails too."""
    return textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {tuple(modules)!r}:
                    raise ImportError(f"blocked: {{name}}")
        sys.meta_path.insert(0, Block())
    """)


def captured_calls(capture_dir: Path, every: int = 1):
    """(mode, step, (input_ids, audio_mask, attention_mask)) of every `every`-th captured
    transformer call of each mode, as generate() made them (run_split's arguments)."""
    from omnivoice_export.step1_capture import capture

    manifest = capture.load_manifest(capture_dir)
    for mode in manifest["modes"]:
        for step in capture.mode_steps(manifest, mode)[::every]:
            data = capture.load_step(capture_dir, mode, step)
            yield mode, step, (data["input_ids"], data["audio_mask"], data["attention_mask"])


def assert_same_bits_on_captured_calls(capture_dir: Path, session, reference, every: int = 1) -> None:
    """`session` and `reference` give the same bits through run_split on every `every`-th captured
    call of every mode, as generate() makes them (the batch mode's padded rows included)."""
    from omnivoice_export.step1_capture import capture
    from omnivoice_onnx.sessions import run_split

    calls = 0
    for mode, step, feeds in captured_calls(capture_dir, every):
        assert np.array_equal(run_split(session, *feeds), run_split(reference, *feeds)), (mode, step)
        calls += 1
    manifest = capture.load_manifest(capture_dir)
    assert list(manifest["modes"]) == list(capture.MODES)
    assert calls == sum(len(capture.mode_steps(manifest, mode)[::every]) for mode in capture.MODES) > 0


# The files that need the session pipeline, longest in wall time first (investigation log: each
# file's wall time on two workers, summed from a per-test timeline; the first also builds the
# pipeline). Wall, not CPU: test_front_door waits on the server's real timeouts more than it computes.
LONGEST_FILES = (
    "test_script_errors.py",
    "test_quantize.py",
    "test_pipeline_safeguards.py",
    "test_front_door.py",
    "test_docs.py",
    "test_runtime_generate.py",
    "test_parity.py",
    "test_batch.py",
    "test_runtime_refusals.py",
    "test_runtime_cli.py",
    "test_fusion.py",
    "test_infer.py",
    "test_clients.py",
    "test_runtime_install.py",
    "test_server.py",
    "test_fetch.py",
    "test_checkpoints.py",
    "test_speak.py",
    "test_hostile_files.py",
    "test_capture.py",
    "test_voices.py",
    "test_wyoming_ha.py",
    "test_dropin.py",
    "test_wyoming.py",
    "test_export.py",
    "test_verified_files.py",
    "test_stream.py",
    "test_model_card.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs the session pipeline (steps 0-2 on tiny, ~100 s on 2 cores) must carry
    the `slow` mark, so that `make test-fast` never builds it: collection fails on one without.

    Then the order in which xdist's loadfile scheduling hands out files (`make test` passes
    --no-loadscope-reorder, so this order is kept): first the longest file that needs the pipeline
    (one worker builds the pipeline at once), then every file that needs none (the other worker
    runs them meanwhile instead of waiting on the build's lock), then the other pipeline files,
    longest first (LONGEST_FILES), so that no long file starts last and runs alone at the end.
    Within a file the order is kept."""
    unmarked = [
        item.nodeid
        for item in items
        if "pipeline" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"mark these @pytest.mark.slow (they use the pipeline fixture): {', '.join(unmarked)}")
    needs_pipeline: dict[Path, bool] = {}
    for item in items:
        needs_pipeline[item.path] = needs_pipeline.get(item.path, False) or "pipeline" in getattr(
            item, "fixturenames", ()
        )

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        longest = LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
        if not needs_pipeline[item.path]:
            return 1, 0
        return (0, 0) if longest == 0 else (2, longest)

    items.sort(key=rank)


def assert_hardware_recorded(meta: dict, results: Path) -> None:
    """A bench results file names the hardware its figures belong to: every ISA flag the
    kernels choose by (present or not), onnxruntime's version, the load average at the start, and the
    measured AMX check; its markdown says the same."""
    from omnivoice_onnx.hardware import ISA_FLAGS

    assert set(meta["cpu"]["isa"]) == set(ISA_FLAGS) and meta["cpu"]["model_name"]
    hardware = meta["hardware"]
    assert hardware["onnxruntime"] and len(hardware["load_average"]) == 3
    check = hardware["amx_check"]
    assert check["gops_per_core"] > 0 and check["amx_ran"] in (True, False, None)
    assert check["amx_ran"] is not True or meta["cpu"]["isa"]["amx_int8"]
    text = results.with_suffix(".md").read_text()
    assert "ISA: " in text and "int8 GEMM check" in text and hardware["onnxruntime"] in text


@pytest.fixture
def small_mount(tmp_path):
    """mount(size) -> a tmpfs of `size` ("ro" for read-only) at a fresh folder, unmounted after the
    test: a real full or read-only file system. Needs root (skipped otherwise)."""
    mounted = []

    def mount(size: str, read_only: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        flags = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", flags, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): needs root")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


CHROMIUM = Path("/usr/bin/chromium")  # Debian's; .ci/run installs it
PAGE_ARGS = ("--autoplay-policy=no-user-gesture-required", "--no-sandbox")  # the page plays audio unprompted


@contextlib.contextmanager
def headless_chromium(args: tuple[str, ...] = PAGE_ARGS) -> Iterator[Any]:
    """Debian's chromium, headless, driven by the venv's Playwright (no browser download); the
    test is skipped where either is missing. Yields the browser, closed afterwards."""
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=list(args))
        try:
            yield browser
        finally:
            browser.close()
