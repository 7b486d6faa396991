"""What ran where: device, driver, CUDA, library versions, date — and the device's peaks.

:func:`environment` goes into the header of every output; :func:`peaks` gives the two
physical ceilings the sanity check holds every figure to (besides the copy measured in
the same run): the DRAM bandwidth from the memory clock and bus width, and the dense FLOP
rate of the unit each dtype runs on, from the SM count, the clock and the architecture —
the tensor cores for float16 / bfloat16, the CUDA cores' FP32 lanes for float32 (the
float32 kernels here run on CUDA cores, so that is the peak they are judged against).
"""

import datetime
import importlib
import importlib.metadata
import platform
import subprocess

# Dense FLOPs per SM per clock of the tensor cores, fp16/bf16 inputs (fp16 accumulation
# where that is faster: an upper bound).
TENSOR_FLOPS_PER_SM_CLOCK = {7: 1024, 8: 2048, 9: 4096, 10: 8192, 12: 2048}
DEFAULT_TENSOR_FLOPS = 8192  # an architecture not listed: assume the largest
# FP32 lanes per SM (one FMA = 2 FLOPs a lane a clock): 64 on sm_70 and sm_80, 128 since.
FP32_LANES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64}
DEFAULT_FP32_LANES = 128


def version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cupy_version():
    for dist in ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"):
        v = version(dist)
        if v != "not installed":
            return v
    return "not installed"


def optional(name):
    """A module, or None when it cannot be imported (an optional peer)."""
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - ImportError, or a broken CUDA install
        return None


def _nvidia_smi_driver():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _device():
    from numba import cuda

    return cuda.get_current_device()


def device_name(sim):
    if sim:
        return "CUDA simulator"
    name = _device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def l2_bytes(sim):
    if sim:
        return 0
    try:
        return int(_device().L2_CACHE_SIZE)
    except Exception:  # noqa: BLE001 - an older binding: assume a large L2 (more sets)
        return 128 << 20


def free_bytes(sim):
    if sim:
        return 1 << 34
    from numba import cuda

    return int(cuda.current_context().get_memory_info()[0])


def environment(sim):
    """Device, driver, versions and date, as ``{name: text}`` (the outputs' header)."""
    if sim:
        device, driver = "CUDA simulator (times are meaningless)", "none (simulator)"
    else:
        dev = _device()
        cc = "".join(map(str, dev.compute_capability))
        device = (f"{device_name(sim)} (sm_{cc}, {dev.MULTIPROCESSOR_COUNT} SMs, "
                  f"L2 {l2_bytes(sim) / 2**20:g} MiB)")
        from numba.cuda.cudadrv.driver import driver as cuda_driver

        major, minor = cuda_driver.get_version()
        driver = f"CUDA {major}.{minor}"
        smi = _nvidia_smi_driver()
        driver += f", driver {smi}" if smi else ""
    return {
        "device": device,
        "driver": driver,
        "versions": ", ".join(f"{d} {version(d)}" for d in ("numba", "numba-cuda", "numpy"))
                    + f", torch {version('torch')}, cupy {cupy_version()}, "
                    + f"triton {version('triton')}, python {platform.python_version()}",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def peaks(sim):
    """``{"dram_gbps": float or None, "tflops": {dtype: float}}``: the device's
    theoretical ceilings (None / empty where unknown: the simulator, or a driver that no
    longer reports the clocks — then those figures go unchecked against a peak)."""
    if sim:
        return {"dram_gbps": None, "tflops": {}}
    dev = _device()
    try:  # kHz × bits × 2 (double data rate) / 8 bits
        dram = dev.MEMORY_CLOCK_RATE * 1e3 * dev.GLOBAL_MEMORY_BUS_WIDTH * 2 / 8 / 1e9
    except Exception:  # noqa: BLE001 - attribute missing: no DRAM ceiling
        dram = None
    try:
        per_clock = TENSOR_FLOPS_PER_SM_CLOCK.get(dev.compute_capability[0],
                                                  DEFAULT_TENSOR_FLOPS)
        lanes = FP32_LANES_PER_SM.get(tuple(dev.compute_capability), DEFAULT_FP32_LANES)
        per_second = dev.MULTIPROCESSOR_COUNT * dev.CLOCK_RATE * 1e3 / 1e12  # max clock, kHz
    except Exception:  # noqa: BLE001 - no clock: no FLOP ceiling
        return {"dram_gbps": dram or None, "tflops": {}}
    tensor, fp32 = per_second * per_clock, per_second * 2 * lanes
    # "tf32": the ceiling of a float32 peer that may use TF32 tensor cores (half the
    # 16-bit rate) — a sanity bound only, never the peak a float32 kernel is judged by
    return {"dram_gbps": dram or None,
            "tflops": {"float16": tensor, "bfloat16": tensor, "float32": fp32,
                       "tf32": tensor / 2}}
