"""Minimal stand-ins for torch / torch_npu: they record what the installer calls.

They mimic torch.utils.cpp_extension.load (the shim it would compile), the shim's
entry points, and torch_npu's / torch's allocator swap (_NPUAllocator / _CUDAAllocator
wrappers, change_current_allocator refusing once the allocator is initialized). The
real wheels run the real shim in tests/torch_npu.
"""

import sys
import types


class FakeNpuAllocatorHandle:
    """What the shim's allocator() returns: torch_npu's / torch's registered
    shared_ptr<NPUAllocator> / shared_ptr<CUDAAllocator> type."""

    def __init__(self, flavour):
        self.flavour = flavour


class FakeAllocatorWrapper:
    """torch_npu.npu.memory._NPUAllocator / torch.cuda.memory._CUDAAllocator."""

    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class FakeShim:
    """What cpp_extension.load returns: the compiled shim module."""

    __file__ = "/nonexistent/npualloc_torch_npu_shim.so"

    def __init__(self, log, flavour, takes_device_allocator=True):
        self._log, self._flavour = log, flavour
        self._takes = takes_device_allocator

    def install_runtime_hooks(self):
        self._log.append(("install_runtime_hooks",))
        return 0

    def allocator(self):
        self._log.append(("allocator",))
        return FakeNpuAllocatorHandle(self._flavour)

    def set_device_allocator(self):
        self._log.append(("set_device_allocator",))
        return self._takes


def install_standins(log, already_initialized=False, torch_version="2.14.0", torch_npu_version="2.14.0",
                     takes_device_allocator=True, cuda_home=None):
    """Registers fake `torch`, `torch.utils.cpp_extension`, `torch_npu`,
    `torch_npu.npu.memory` and `torch.cuda.memory` modules in sys.modules."""

    def change_current_allocator(a):
        if already_initialized:
            raise RuntimeError("Can't swap an already initialized allocator")
        log.append(("change_current_allocator", a))

    npu_memory = types.ModuleType("torch_npu.npu.memory")
    npu_memory._NPUAllocator = FakeAllocatorWrapper
    npu_memory.change_current_allocator = change_current_allocator
    npu = types.ModuleType("torch_npu.npu")
    npu.memory = npu_memory
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.npu = npu
    torch_npu.__file__ = "/nonexistent/torch_npu/__init__.py"
    torch_npu.__version__ = torch_npu_version

    def load(name, sources, **kwargs):
        log.append(("cpp_extension.load", name, tuple(sources), kwargs))
        flavour = "cuda" if sources[0].endswith("cuda_shim.cpp") else "npu"
        return FakeShim(log, flavour, takes_device_allocator)

    cpp_extension = types.ModuleType("torch.utils.cpp_extension")
    cpp_extension.load = load
    cpp_extension.verify_ninja_availability = lambda: None
    cpp_extension.CUDA_HOME = cuda_home
    utils = types.ModuleType("torch.utils")
    utils.cpp_extension = cpp_extension
    cuda_memory = types.ModuleType("torch.cuda.memory")
    cuda_memory._CUDAAllocator = FakeAllocatorWrapper
    cuda_memory.change_current_allocator = change_current_allocator
    cuda = types.ModuleType("torch.cuda")
    cuda.memory = cuda_memory
    torch = types.ModuleType("torch")
    torch.utils = utils
    torch.cuda = cuda
    torch.__version__ = torch_version
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.__file__ = "/nonexistent/torch/__init__.py"
    sys.modules.update({
        "torch": torch, "torch.utils": utils, "torch.utils.cpp_extension": cpp_extension,
        "torch.cuda": cuda, "torch.cuda.memory": cuda_memory,
        "torch_npu": torch_npu, "torch_npu.npu": npu, "torch_npu.npu.memory": npu_memory,
    })


def remove_standins():
    for name in list(sys.modules):
        if name == "torch" or name.startswith("torch.") or name.startswith("torch_npu"):
            del sys.modules[name]
