"""moegen — MoE layers generated for NVIDIA GPUs, from Python.

    import moegen
    plan = moegen.Plan("examples/specs/mixtral-8x7b.moe")   # or a dict of keys
    plan.info.experts, plan.tensors["w1p"]                  # (shape, dtype)

PyTorch: moegen.torch (the moegen::moe op and the MoE module). The library
is loaded and checked (version, struct layouts) on first use: see
moegen._lib for where it is looked for ($MOEGEN_LIBRARY first)."""
from ._lib import LibraryError, MoegenError, library
from ._version import __version__
from .plan import Plan
from .spec import spec_text

__all__ = ["Plan", "MoegenError", "LibraryError", "library", "spec_text", "__version__"]
