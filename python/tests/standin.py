"""Minimal stand-ins for torch / torch_npu: they record what the installer calls.

They mimic torch_npu's NPUPluggableAllocator loading (ctypes.CDLL, getattr of the two
names, their addresses) and the setters of `.allocator()`.
"""

import ctypes
import sys
import types


class FakeBackendAllocator:
    def __init__(self, log):
        self.log = log

    def __getattr__(self, name):
        if not name.startswith("set_"):
            raise AttributeError(name)

        def setter(fn_address):
            assert isinstance(fn_address, int) and fn_address != 0, (name, fn_address)
            self.log.append((name, fn_address))
        return setter


class FakePluggable:
    """Loads the library exactly as torch_npu's NPUPluggableAllocator.__init__ does."""

    def __init__(self, path, alloc_fn_name, free_fn_name, log):
        if path == FakeShim.__file__:  # the shim's own entry points (no real file here)
            self._allocator = FakeBackendAllocator(log)
            log.append(("customAllocator", path, alloc_fn_name, free_fn_name))
            return
        lib = ctypes.CDLL(path)
        self.alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        self.free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        self._allocator = FakeBackendAllocator(log)
        log.append(("customAllocator", self.alloc_fn, self.free_fn))

    def allocator(self):
        return self._allocator


class FakeShim:
    """What cpp_extension.load returns: the compiled shim module."""

    __file__ = "/nonexistent/npualloc_torch_npu_shim.so"

    def __init__(self, log, addresses):
        self._log, self._addresses = log, addresses

    def __getattr__(self, name):
        if name == "install_runtime_hooks":
            return lambda: self._log.append(("install_runtime_hooks",)) or 0
        return lambda: self._addresses.get(name, 0x1000 + len(name))


def install_standins(log, already_initialized=False, shim_addresses=None):
    """Registers fake `torch`, `torch.utils.cpp_extension`, `torch_npu`,
    `torch_npu.npu.memory` and `torch.cuda.memory` modules in sys.modules."""
    shim_addresses = shim_addresses or {}

    def change_current_allocator(a):
        if already_initialized:
            raise RuntimeError("Can't swap an already initialized allocator")
        log.append(("change_current_allocator", a))

    npu_memory = types.ModuleType("torch_npu.npu.memory")
    npu_memory.NPUPluggableAllocator = lambda p, a, f: FakePluggable(p, a, f, log)
    npu_memory.change_current_allocator = change_current_allocator
    npu = types.ModuleType("torch_npu.npu")
    npu.memory = npu_memory
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.npu = npu
    torch_npu.__file__ = "/nonexistent/torch_npu/__init__.py"

    def load(name, sources, **kwargs):
        log.append(("cpp_extension.load", name, tuple(sources)))
        return FakeShim(log, shim_addresses)

    cpp_extension = types.ModuleType("torch.utils.cpp_extension")
    cpp_extension.load = load
    cpp_extension.verify_ninja_availability = lambda: None
    utils = types.ModuleType("torch.utils")
    utils.cpp_extension = cpp_extension
    cuda_memory = types.ModuleType("torch.cuda.memory")
    cuda_memory.CUDAPluggableAllocator = lambda p, a, f: FakePluggable(p, a, f, log)
    cuda_memory.change_current_allocator = change_current_allocator
    cuda = types.ModuleType("torch.cuda")
    cuda.memory = cuda_memory
    torch = types.ModuleType("torch")
    torch.utils = utils
    torch.cuda = cuda
    sys.modules.update({
        "torch": torch, "torch.utils": utils, "torch.utils.cpp_extension": cpp_extension,
        "torch.cuda": cuda, "torch.cuda.memory": cuda_memory,
        "torch_npu": torch_npu, "torch_npu.npu": npu, "torch_npu.npu.memory": npu_memory,
    })


def remove_standins():
    for name in list(sys.modules):
        if name == "torch" or name.startswith("torch.") or name.startswith("torch_npu"):
            del sys.modules[name]
