"""npualloc.install() into the real torch_npu leaves no error behind: the shim builds
(torch_npu's include folders, C++20, ninja) and loads (linked to libtorch_npu, only
exported API), and torch_npu's init (which passes the device count) is accepted
(issue #13 items 1-4)."""
from common import check, passed, start

ctx = start()
torch = ctx.torch
x = torch.empty(1024, device="npu")  # torch_npu calls init_fn, then malloc
check(ctx.npualloc.last_error() is None, "install left an error: %s" % ctx.npualloc.last_error())
check(torch.npu.memory_allocated() > 0, "no allocation seen")
check(ctx.lib.npualloc_base_alloc(x.data_ptr(), None) is not None,
      "the tensor's memory is not npualloc's")
check(ctx.lib.npualloc_device_count() == 2, "stand-in has 2 devices")
check(torch.npu.memory.get_allocator_backend() == "npualloc", "torch_npu's current allocator is %r"
      % torch.npu.memory.get_allocator_backend())
passed("install_no_error")
