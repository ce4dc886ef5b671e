"""torch_gpu.py - what the GPU scripts here share: skip cleanly where
PyTorch with a usable CUDA device is not there."""
import importlib
import sys


def require(script, *modules):
    """Imports torch (and `modules`) and checks for a CUDA device; if any
    of it is missing, prints "SCRIPT: skipped: WHY" and exits 77, the
    status ctest and gpu_checks.sh read as skipped."""
    try:
        import torch
        for m in modules:
            importlib.import_module(m)
        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except Exception as e:  # noqa: BLE001 - any failure to import means: skip
        print("%s: skipped: %s" % (script, e))
        sys.exit(77)
