"""Which MatMuls the `int8-mixed` recipe keeps fp32: each one's measured share of the logit error.

Why: after the scales are calibrated (omnivoice_export.step56_variants.smoothing) some MatMuls still lose more than
the rest, and where is a property of the model: the down_proj that writes a massive activation
(its input row spikes ~1000x: a per-row scale saves the other rows, not that one), a layer whose
error the later ones amplify. OmniVoice#152 kept every down_proj in higher precision on the trained
model and recovered a third of int8's argmax disagreement; keeping all of them costs speed where
one or two would do. So the choice is measured on the capture's calls:

1. contribution: the smoothed graph runs with one MatMul int8 and every other fp32; its relative
   logit error against all-fp32 (||dL|| / ||L|| over the rows read) is that MatMul's contribution.
   Measured only when the all-int8 graph misses the target: the sweep is one forward per MatMul per
   call (196 MatMuls at the real dims), and with nothing to keep fp32 it would choose nothing.
2. selection: one MatMul at a time is kept fp32, the one of the CANDIDATES largest contributions
   that raises argmax agreement with fp32 on the calibration calls most, until the agreement
   reaches TARGET_MEAN on average and TARGET_MIN on every call, no candidate raises it, or the kept
   ones would pass MAX_FP32_SHARE of the quantized multiply-adds (then the target is reported as
   not reached: the recipe does not buy quality with unbounded speed).

Both run in one session of rowwise.quantize_rowwise's switch graph (each MatMul's fp32 and int8
forms, picked per call by a bool input), so a mix costs one forward, not one graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from omnivoice_export.step56_variants import rowwise

TARGET_MEAN = 0.99  # argmax agreement with fp32 over the calibration calls, on average
TARGET_MIN = 0.97  # ... and on every call
MAX_FP32_SHARE = 0.125  # the most of the quantized multiply-adds (weight elements) kept fp32
CANDIDATES = 8  # each round tries this many MatMuls, largest contribution first, and keeps the best


@dataclass
class Selection:
    """What the measurement chose and saw."""

    order: list[str]  # every quantized MatMul, largest contribution first (none: not measured)
    contribution: dict[str, float]  # relative logit error with only that MatMul int8 (empty: not measured)
    kept: list[str]  # the MatMuls kept fp32
    agreement: list[float]  # per calibration call, with `kept` fp32
    all_int8: list[float]  # per calibration call, with nothing kept
    fp32_share: float  # share of the quantized weight elements `kept` holds
    reached: bool  # the target was reached within MAX_FP32_SHARE


def read_rows(feeds: dict[str, np.ndarray], logits: np.ndarray) -> np.ndarray:
    """A bool mask over logits[..., :-1]'s positions that the caller reads: OmniVoice's audio
    positions ([B, C, S, V] logits, `audio_mask` [B, S]), or every position of another graph."""
    mask = feeds.get("audio_mask")
    if mask is not None and logits.ndim == 4:
        return np.broadcast_to(mask[:, None, :], logits.shape[:-1])
    return np.ones(logits.shape[:-1], dtype=bool)


class SwitchGraph:
    """One session of the switch graph: logits for any kept-fp32 set on the calibration calls."""

    def __init__(self, model: onnx.ModelProto, exclude: list[str], calls: list[dict[str, np.ndarray]], workdir: Path):
        from omnivoice_export.step2_export.report import save_with_sidecar
        from omnivoice_onnx.sessions import make_session

        inits = {init.name: init for init in model.graph.initializer}
        matmuls = rowwise.weight_matmuls(model.graph, set(exclude))  # the switch input's order
        self.names = [node.name for node in matmuls]
        self.sizes = {node.name: int(np.prod(inits[node.input[1]].dims)) for node in matmuls}
        switch = onnx.ModelProto()
        switch.CopyFrom(model)
        rowwise.quantize_rowwise(switch, exclude, switch=True)
        path = Path(workdir) / "sensitivity-switch.onnx"
        save_with_sidecar(switch, path)
        del switch
        self.session = make_session(path, fix="re-run quantize_omnivoice.py")
        self.output = self.session.get_outputs()[0].name
        self.calls = calls
        self.reference = [self.logits(call, set(self.names)) for call in calls]
        self.rows = [read_rows(call, ref) for call, ref in zip(calls, self.reference, strict=True)]

    def logits(self, call: dict[str, np.ndarray], fp32: set[str]) -> np.ndarray:
        select = np.array([name in fp32 for name in self.names])
        logits: np.ndarray = self.session.run([self.output], {**call, rowwise.SWITCH_INPUT: select})[0]
        return logits

    def agreement(self, fp32: set[str]) -> list[float]:
        """Per calibration call: argmax agreement with all-fp32 over the rows read."""
        return [
            float(np.mean(self.logits(call, fp32).argmax(-1)[rows] == ref.argmax(-1)[rows]))
            for call, ref, rows in zip(self.calls, self.reference, self.rows, strict=True)
        ]

    def relative_error(self, fp32: set[str]) -> float:
        """||dL|| / ||L|| over the rows read of every calibration call."""
        error = total = 0.0
        for call, ref, rows in zip(self.calls, self.reference, self.rows, strict=True):
            diff = (self.logits(call, fp32) - ref)[rows]
            error += float(np.sum(diff.astype(np.float64) ** 2))
            total += float(np.sum(ref[rows].astype(np.float64) ** 2))
        ratio: float = (error / max(total, 1e-30)) ** 0.5  # float ** float is typed Any (a complex result)
        return ratio


def select_fp32(
    model: onnx.ModelProto,
    exclude: list[str],
    calls: list[dict[str, np.ndarray]],
    workdir: Path,
    log: Callable[[str], object] = lambda _line: None,
) -> Selection:
    """Measure every quantized MatMul's contribution and keep the fewest fp32 that reach the
    target (module docstring). `model` is the smoothed fp32 graph, before quantize_rowwise."""
    graph = SwitchGraph(model, exclude, calls, workdir)

    def good(agreement: list[float]) -> bool:
        return float(np.mean(agreement)) >= TARGET_MEAN and min(agreement) >= TARGET_MIN

    all_int8 = graph.agreement(set())
    seen = f"all int8, argmax agreement {np.mean(all_int8):.4f} mean / {min(all_int8):.4f} min on the calls"
    if good(all_int8):  # nothing to keep: no sweep (module docstring)
        log(f"[quantize] {seen}: the target ({TARGET_MEAN} / {TARGET_MIN}) is reached, nothing kept fp32")
        return Selection([], {}, [], all_int8, all_int8, 0.0, True)
    log(f"[quantize] {seen}: under the target; measuring each of {len(graph.names)} MatMuls' share of the error")
    everything = set(graph.names)
    contribution: dict[str, float] = {}
    for index, name in enumerate(graph.names, 1):
        contribution[name] = graph.relative_error(everything - {name})
        if index % max(1, len(graph.names) // 10) == 0 or index == len(graph.names):
            log(f"[quantize]   {index}/{len(graph.names)} measured")
    order = sorted(graph.names, key=lambda name: -contribution[name])
    budget = MAX_FP32_SHARE * sum(graph.sizes.values())
    kept: list[str] = []
    agreement = all_int8
    while not good(agreement):
        used = sum(graph.sizes[name] for name in kept)
        candidates = [name for name in order if name not in kept and used + graph.sizes[name] <= budget]
        trials = {name: graph.agreement({*kept, name}) for name in candidates[:CANDIDATES]}
        if not trials:
            break
        best = max(trials, key=lambda name: (float(np.mean(trials[name])), min(trials[name])))
        if float(np.mean(trials[best])) <= float(np.mean(agreement)):
            break  # keeping one more fp32 no longer helps on the calibration calls
        kept.append(best)
        agreement = trials[best]
    return Selection(
        order=order,
        contribution=contribution,
        kept=kept,
        agreement=agreement,
        all_int8=all_int8,
        fp32_share=sum(graph.sizes[name] for name in kept) / sum(graph.sizes.values()),
        reached=good(agreement),
    )
