"""Records name the CPU model and the features XLA:CPU's GEMM kernels depend on, read from
``/proc/cpuinfo`` (two CPU measurements on "the same" virtual machine compare only on one CPU)."""

import pathlib

from tierax import records

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu vme sse2 avx fma avx2 avx512f avx512_bf16 sha_ni
bogomips\t: 5199.99

processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu avx2 amx_tile
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes bf16
"""


def test_cpu_model_reads_the_first_processors_name_and_gemm_features():
    got = records.cpu_model(X86)
    assert got == {
        "cpu_model": "AMD EPYC 9B14",
        "cpu_features": ["avx2", "fma", "avx512f", "avx512_bf16"],
    }
    # A feature only the second processor lists is not the first's (amx_tile), and a substring of
    # a flag is not the flag (avx512f does not make avx512_vnni).
    assert "amx_tile" not in got["cpu_features"] and "avx512_vnni" not in got["cpu_features"]


def test_cpu_model_without_a_model_name_or_features():
    assert records.cpu_model(ARM) == {"cpu_features": []}
    assert records.cpu_model("") == {}


def test_host_info_carries_this_machines_cpu_model():
    info = records.host_info()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        assert info | records.cpu_model(cpuinfo.read_text()) == info
    assert info["python"] and info["cpu"]
