"""The hardware a speed figure belongs to: ISA flags from /proc/cpuinfo, the measured
AMX check, the results-file names that keep CPUs apart, and `omnivoice-onnx info`'s CPU line."""

from __future__ import annotations

import pytest

from omnivoice_export.common import measure
from omnivoice_onnx import hardware

SAPPHIRE_RAPIDS = {
    "vendor_id": "GenuineIntel",
    "cpu family": "6",
    "model": "143",
    "model name": "Intel(R) Xeon(R)",
    "flags": "fpu avx2 avx512f avx512_vnni avx_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8",
}
ZEN4 = {
    "vendor_id": "AuthenticAMD",
    "cpu family": "25",
    "model": "17",
    "model name": "AMD EPYC",
    "flags": "fpu avx2 avx512f avx512_vnni avx512_bf16",
}


def test_isa_flags_are_read_from_cpuinfo_and_unknown_without_it() -> None:
    """Every flag of ISA_FLAGS is reported, True or False, from the flags line; None (unknown,
    not absent) where there is no /proc/cpuinfo."""
    intel, amd = hardware.cpu_isa(SAPPHIRE_RAPIDS), hardware.cpu_isa(ZEN4)
    assert all(intel.values())
    assert amd == {flag: flag in ZEN4["flags"].split() for flag in hardware.ISA_FLAGS}
    assert not amd["amx_int8"] and amd["avx512_vnni"]
    assert hardware.cpu_isa({}) == dict.fromkeys(hardware.ISA_FLAGS)
    assert hardware.cpu_name(ZEN4) == "AMD EPYC (AuthenticAMD family 25 model 17)"


def test_hardware_record_names_isa_onnxruntime_load_and_a_measured_amx_verdict() -> None:
    """The record every results file carries; the AMX verdict is consistent with the flags and the
    measured rate: True only above the VNNI bound and on a CPU with AMX-INT8."""
    import onnxruntime as ort

    record = measure.hardware_record()
    cpu = measure.cpu_description()
    check = record["amx_check"]
    assert record["onnxruntime"] == ort.__version__ and len(record["load_average"]) == 3
    assert set(cpu["isa"]) == set(hardware.ISA_FLAGS)
    assert check["dims"] == list(measure.AMX_CHECK_DIMS) and check["gops_per_core"] >= check["gops_per_core_median"] > 0
    if not cpu["isa"]["amx_int8"]:
        assert check["amx_ran"] is False
    elif check["amx_ran"]:
        assert (
            check["gops_per_core"]
            > check["amx_bound_gops_per_core"]
            == pytest.approx(measure.TURBO_MARGIN * cpu["mhz"] / 1e3 * measure.VNNI_OPS_PER_CYCLE, abs=0.1)
        )
    assert "int8 GEMM check" in measure.amx_line(check)
    assert measure.hardware_record(check_amx=False)["amx_check"] is None


def test_results_files_of_two_cpus_do_not_share_a_name() -> None:
    """Every VM here is called `vm`: the CPU tag keeps an Intel and a Zen 4 run of one day apart."""
    intel = {"vendor": "GenuineIntel", "family": "6", "model": "143"}
    amd = {"vendor": "AuthenticAMD", "family": "25", "model": "17"}
    assert (measure.cpu_tag(intel), measure.cpu_tag(amd)) == ("intel-f6m143", "amd-f25m17")
    assert measure.results_stem("full-random").endswith(f"-{measure.cpu_tag()}-full-random")


def test_integer_gemm_ops_compute_the_product() -> None:
    """The one-node GEMM the AMX check times is the u8 x s8 product it claims (its weight is the
    first draw of a seed-0 generator)."""
    import numpy as np

    session, feeds = measure.integer_gemm_session(8, 16, 24, "MatMulInteger", threads=1)
    weight = np.random.default_rng(0).integers(-127, 128, size=(16, 24), dtype=np.int8)
    (out,) = session.run(None, feeds)
    assert feeds["x"].dtype == np.uint8 and out.dtype == np.int32
    np.testing.assert_array_equal(out, feeds["x"].astype(np.int32) @ weight.astype(np.int32))
    with pytest.raises(ValueError, match="unknown integer GEMM op"):
        measure.integer_gemm_session(8, 16, 24, "Gemm")


def test_openvino_provider_missing_is_one_line(monkeypatch) -> None:
    """Without the plugin package the OpenVINO providers are refused with the install line."""
    import sys

    from omnivoice_onnx import UserError
    from omnivoice_onnx.sessions import OPENVINO_INSTALL_HINT, check_provider, openvino_device

    monkeypatch.setitem(sys.modules, "onnxruntime_ep_openvino", None)  # import fails as if absent
    openvino_device.cache_clear()  # a device found earlier in this process is cached
    with pytest.raises(UserError, match="onnxruntime-ep-openvino") as error:
        check_provider("openvino-bf16")
    assert error.value.fix == OPENVINO_INSTALL_HINT


@pytest.mark.slow
def test_openvino_providers_run_the_transformer_and_keep_the_codec_on_the_cpu(pipeline) -> None:
    """openvino-f32 and -bf16 run the faithful transformer on OpenVINO (the session says so) and the
    codecs on the CPU provider; f32 stays within float32 rounding of the CPU provider's logits, bf16
    does not (a speed trade-off, measured, never parity). The calls are one split layout of the
    capture's first step."""
    import numpy as np

    pytest.importorskip("onnxruntime_ep_openvino")
    from omnivoice_onnx import OmniVoiceOnnx
    from omnivoice_onnx.errors import UserError
    from omnivoice_onnx.hardware import cpu_name
    from omnivoice_onnx.sessions import openvino_device, run_split

    try:
        openvino_device()
    except UserError as error:  # the plugin lists no device for this CPU: the one line says so, naming it
        assert str(error).count("\n") == 0 and cpu_name() in str(error) and "--provider cpu" in str(error)
        pytest.skip(f"OpenVINO's plugin offers no CPU device here ({cpu_name()})")

    feeds = dict(np.load(pipeline.capture / "clone" / "transformer_step_00.npz"))
    inputs = (feeds["input_ids"], feeds["audio_mask"], feeds["attention_mask"])
    logits = {}
    for provider in ("cpu", "openvino-f32", "openvino-bf16"):
        tts = OmniVoiceOnnx.from_dir(pipeline.onnx, provider=provider, variant="fp32", threads=1)
        assert tts.transformer.get_providers()[0] == (
            "CPUExecutionProvider" if provider == "cpu" else "OpenVINOExecutionProvider"
        )
        assert tts.codecs.provider == "cpu"
        logits[provider] = run_split(tts.transformer, *inputs)
    scale = float(np.abs(logits["cpu"]).max())
    assert float(np.abs(logits["openvino-f32"] - logits["cpu"]).max()) < 1e-4 * scale
    assert not np.array_equal(logits["openvino-bf16"], logits["cpu"])
