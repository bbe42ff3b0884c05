"""The seed example of torchair's reduce-overhead (aclgraph) mode, shared by the
`torchair_seed` scenario and scripts/graph_memory.py.

`Seed` is the aclgraph multi-stream example of torchair's documentation ("图内多流表达功能
（aclgraph）", usage example; torchair/docs in the torch_npu 2.14 wheel's torchair):
an add on the main stream; on tagged stream '1', after waiting on a tagged event, an mm,
another tagged event record, `B = in3 + in4` with `npu_record_tagged_stream(B, '1')`;
an mm on the main stream; `del B`; `C = torch.ones(N, N)` and `C.add_(2)`; on tagged
stream '2', after waiting on the second event, an add. The documentation uses
1000 x 1000 float16 inputs; here N is a parameter (64 in the scenario).

`scratch_mib` adds, on tagged stream '1', an intermediate of that many MiB (float32)
that lives only inside the graph: its block is freed during the capture, so the graph's
pool keeps its segment while the graph lives. `Wide` is the larger multi-shape variant
of the benchmark: intermediates of 16 n^2 bytes (n x 4n float32) on both tagged streams,
a few dozen MiB at n = 1024.

Each instance creates its own tagged events (a tag can be created once per process).
"""

import itertools

_tags = itertools.count(66)


def new_tag():
    return str(next(_tags))


def seed_class(torch, tng):
    class Seed(torch.nn.Module):
        def __init__(self, n_c, scratch_mib=0):
            super().__init__()
            self.n_c = n_c
            self.scratch = (scratch_mib << 20) // 4
            self.tagged_event1 = tng.ops.npu_create_tagged_event(tag=new_tag())
            self.tagged_event2 = tng.ops.npu_create_tagged_event(tag=new_tag())

        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            tng.ops.npu_tagged_event_record(self.tagged_event1)
            with tng.scope.npu_stream_switch('1'):
                tng.ops.npu_tagged_event_wait(self.tagged_event1)
                mm_result = torch.mm(in3, in4)
                if self.scratch:
                    big = torch.ones(self.scratch, dtype=torch.float32, device=in3.device)
                    mm_result = mm_result + big[:1].to(mm_result.dtype)
                tng.ops.npu_tagged_event_record(self.tagged_event2)
                B = in3 + in4
                tng.ops.npu_record_tagged_stream(B, '1')
            mm1 = torch.mm(in3, in4)
            del B
            C = torch.ones(self.n_c, self.n_c, dtype=torch.float16, device=in1.device)
            C.add_(2)
            with tng.scope.npu_stream_switch('2'):
                tng.ops.npu_tagged_event_wait(self.tagged_event2)
                add2 = torch.add(in3, in4)
            return add_result, mm_result, mm1, add2, C

    return Seed


def wide_class(torch, tng):
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tagged_event1 = tng.ops.npu_create_tagged_event(tag=new_tag())
            self.tagged_event2 = tng.ops.npu_create_tagged_event(tag=new_tag())

        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            tng.ops.npu_tagged_event_record(self.tagged_event1)
            with tng.scope.npu_stream_switch('1'):
                tng.ops.npu_tagged_event_wait(self.tagged_event1)
                w1 = torch.cat([in3, in4, in3, in4], dim=1).float()  # n x 4n float32
                w2 = w1 * 2
                mm_result = torch.mm(in3, in4) + w2[:, :in3.shape[1]].to(in3.dtype)
                tng.ops.npu_tagged_event_record(self.tagged_event2)
                B = in3 + in4
                tng.ops.npu_record_tagged_stream(B, '1')
            mm1 = torch.mm(in3, in4)
            del B
            with tng.scope.npu_stream_switch('2'):
                tng.ops.npu_tagged_event_wait(self.tagged_event2)
                w3 = torch.cat([in1, in2, in3, in4], dim=1).float()
                add2 = torch.add(in3, in4) + w3[:, :in3.shape[1]].to(in3.dtype)
            return add_result, mm_result, mm1, add2

    return Wide


def inputs(torch, n):
    return [torch.randn(n, n, dtype=torch.float16).npu() for _ in range(4)]


def compile_reduce_overhead(torch, tng, model, dynamic):
    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    backend = tng.get_npu_backend(compiler_config=config)
    return torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=True)


def pool_segments(torch):
    """Every graph-pool segment of torch.npu.memory_snapshot(): (pool id, raw stream,
    total size)."""
    return [(tuple(s["segment_pool_id"]), s["stream"], s["total_size"])
            for s in torch.npu.memory_snapshot() if tuple(s["segment_pool_id"]) != (0, 0)]
