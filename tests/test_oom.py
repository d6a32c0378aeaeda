"""Out-of-memory classification (tierax.xla.oom): which XLA errors are a refusal for device memory
(a compile result, fits false) and the figures read from them, against libtpu's message forms
written out by hand."""

import pytest

from tierax.xla.oom import out_of_memory

GIB = 2**30


@pytest.mark.parametrize(
    "message, required, available",
    [
        (  # libtpu 0.0.42.1's early check
            "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
            "space hbm. memory required for HLO temporaries (111.76G) exceeds available HBM "
            "(15.75G)",
            int(111.76 * GIB),
            int(15.75 * GIB),
        ),
        (  # libtpu 0.0.52's prefix
            "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: memory required for HLO temporaries "
            "(512.50M) exceeds available HBM (95.74G)",
            int(512.5 * 2**20),
            int(95.74 * GIB),
        ),
        (  # the allocation check
            "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.01G of 15.75G hbm. "
            "Exceeded hbm capacity by 4.26G.",
            int(20.01 * GIB),
            int(15.75 * GIB),
        ),
        ("RESOURCE_EXHAUSTED: Used 900K of 1T hbm", 900 * 2**10, 2**40),
        ("RESOURCE_EXHAUSTED: Used 12 of 8 hbm", 12, 8),  # bytes: no unit
    ],
)
def test_an_hbm_refusal_is_out_of_memory_with_xlas_figures_in_binary_units(
    message, required, available
):
    oom = out_of_memory(RuntimeError(message + "\n\nmore lines"))
    assert oom is not None
    assert (oom.required_bytes, oom.available_bytes) == (required, available)
    assert oom.message == message  # the first line only


def test_a_refusal_without_figures_is_still_out_of_memory():
    oom = out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: out of memory while compiling\nx"))
    assert oom is not None and oom.required_bytes is None and oom.available_bytes is None
    assert oom.message == "RESOURCE_EXHAUSTED: out of memory while compiling"


@pytest.mark.parametrize(
    "message",
    [
        # one fusion over the scoped vector memory: a compiler limit, not the program's size
        "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack for "
        "%fusion.3. Scoped allocation with size 17.50M and limit 16.00M exceeded scoped vmem "
        "limit by 1.50M.",
        "RESOURCE_EXHAUSTED: Scoped VMEM limit exceeded: Used 20.01G of 15.75G hbm",
        # another error, whatever figures it quotes
        "INVALID_ARGUMENT: memory required for HLO temporaries (111.76G) exceeds available HBM "
        "(15.75G)",
        "INTERNAL: Used 20.01G of 15.75G hbm",
    ],
)
def test_other_errors_are_not_out_of_memory(message):
    assert out_of_memory(RuntimeError(message)) is None
