"""The CPU a speed figure belongs to: its name and the instruction sets the kernels choose by.

A figure measured here does not carry over to a CPU without the same instruction sets:
onnxruntime's MLAS picks its int8 GEMM by ISA (AMX tiles where the OS grants them, else AVX-512
VNNI, else AVX-VNNI, else AVX2), and its fp32 GEMM by AVX-512F vs AVX2. Every results file of the
bench records `cpu_isa()`; `omnivoice-onnx info` prints `isa_line()`. Read from /proc/cpuinfo
(Linux); elsewhere the flags are None (unknown, not absent). Whether the AMX kernel actually ran
is a measurement, not a flag: omnivoice_export.common.measure.amx_check.

Imports nothing outside the standard library (a ground-floor module).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The flags that decide which GEMM kernels run, in the order a reader compares CPUs by:
# fp32 (avx2, avx512f), int8 dot products (avx512_vnni, avx_vnni), bf16/fp16 arithmetic, AMX tiles.
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def cpuinfo_fields() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    if CPUINFO.is_file():
        for text in CPUINFO.read_text().splitlines():
            key, _, value = text.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_isa(fields: dict[str, str] | None = None) -> dict[str, bool | None]:
    """{flag: present} for every ISA_FLAGS entry; None for each when the flags cannot be read."""
    fields = cpuinfo_fields() if fields is None else fields
    flags = set(fields.get("flags", "").split())
    return {flag: (flag in flags) if flags else None for flag in ISA_FLAGS}


def cpu_name(fields: dict[str, str] | None = None) -> str:
    """The CPU's model string, with vendor/family/model where /proc/cpuinfo has them (a KVM guest
    may report a generic name: the family and model numbers still tell Zen 4 from Sapphire Rapids)."""
    fields = cpuinfo_fields() if fields is None else fields
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields:
        name += f" ({fields.get('vendor_id')} family {fields['cpu family']} model {fields.get('model')})"
    return name


def isa_line() -> str:
    """One line for people: the CPU, its cores, and the ISA flags it has (absent ones omitted)."""
    fields = cpuinfo_fields()
    isa = cpu_isa(fields)
    present = [flag for flag, has in isa.items() if has]
    flags = ", ".join(present) if present else ("none of " + ", ".join(ISA_FLAGS) if fields else "unknown")
    return f"{cpu_name(fields)}, {os.cpu_count()} logical cores; {flags}"
