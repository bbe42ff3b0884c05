#!/usr/bin/env python3
"""Capture the trace zoo: real models running in PyTorch on CPU, recorded as npualloc traces.

Each workload builds its model from a config with random weights (no downloads), moves
nothing to any device, and runs a few steps under
``torch.profiler.profile(profile_memory=True)`` on one thread. Every allocation and free
the CPU allocator reports inside the profiled region becomes one trace line
(``a <id> <bytes> 0`` / ``f <id>``), in the order they happened. Memory allocated before
the profiled region (parameters, inputs built beforehand) is not in the trace, and a free
of such memory is dropped; what is still live when the region ends stays unfreed.

This is for people re-capturing the zoo, not for CI (the traces are committed):

    python3 -m venv zoo-venv
    zoo-venv/bin/pip install torch==2.14.0 transformers torchvision diffusers peft
    nice -n 10 zoo-venv/bin/python scripts/zoo/capture.py --out traces/zoo [NAME ...]

With no NAME every workload is captured. For each trace it prints one row of the table in
``traces/README.md`` (events, allocations, unfreed, peak live requested bytes, ...).
"""

import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

WORKLOADS = {}


def workload(name, desc):
    """Registers a workload: ``fn()`` builds the model and returns the step to profile."""

    def register(fn):
        WORKLOADS[name] = (desc, fn)
        return fn

    return register


def seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- helpers


def adamw_train_steps(model, make_batch, steps, loss_fn, params=None):
    """Returns a closure running ``steps`` training steps (forward, backward, AdamW step)."""
    params = [p for p in (params or model.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    batches = [make_batch(i) for i in range(steps)]
    model.train()

    def run():
        for b in batches:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, b)
            loss.backward()
            opt.step()
            del loss

    return run


def greedy_generate(model, ids, new_tokens, **kw):
    """Greedy decoding of exactly ``new_tokens`` tokens (random weights never stop early)."""
    with torch.no_grad():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            **kw,
        )


def image_inference(model, shapes):
    """Inference on random images, one batch per (batch size, resolution) in ``shapes``."""
    model.eval()

    def run():
        with torch.no_grad():
            for b, r in shapes:
                model(torch.randn(b, 3, r, r))

    return run


def small_unet():
    """A Stable-Diffusion-shaped conditional UNet at a CPU-friendly width."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=64,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=1,
        cross_attention_dim=768,
        attention_head_dim=8,
    )


def tiny_llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=2048,
        attn_implementation="sdpa",
    )
    base.update(kw)
    return LlamaConfig(**base)


# ----------------------------------------------------------------------------- small inference


@workload(
    "llama_decode",
    "transformers.LlamaForCausalLM (512 hidden, 8 layers, 32k vocab), greedy generate: "
    "batch 1, prompt 128, 96 new tokens (growing DynamicCache), fp32",
)
def llama_decode():
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_llama_config()).eval()
    ids = torch.randint(0, 32000, (1, 128))
    return lambda: greedy_generate(model, ids, 96, pad_token_id=0)


@workload(
    "gpt2_decode_batch8",
    "transformers.GPT2LMHeadModel (GPT-2 small sized), greedy generate: batch 8, prompt 64, "
    "64 new tokens (growing DynamicCache), fp32",
)
def gpt2_decode_batch8():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).eval()
    ids = torch.randint(0, 50257, (8, 64))
    return lambda: greedy_generate(model, ids, 64, pad_token_id=0)


@workload(
    "vit_infer",
    "torchvision.models.vit_b_16(weights=None), inference, batch 4, 224x224, 3 batches, fp32",
)
def vit_infer():
    import torchvision

    return image_inference(torchvision.models.vit_b_16(weights=None), [(4, 224)] * 3)


@workload(
    "mobilenet_infer",
    "torchvision.models.mobilenet_v3_large(weights=None), inference, batch 16, 224x224, "
    "4 batches, fp32",
)
def mobilenet_infer():
    import torchvision

    model = torchvision.models.mobilenet_v3_large(weights=None)
    return image_inference(model, [(16, 224)] * 4)


@workload(
    "mlp_infer",
    "pure torch MLP (784-2048-2048-2048-10, GELU, LayerNorm), inference, batches of "
    "1, 32, 256, 64, 512, 16, 128 rows, fp32",
)
def mlp_infer():
    layers = []
    dims = [784, 2048, 2048, 2048]
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.LayerNorm(b), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(2048, 10)).eval()

    def run():
        with torch.no_grad():
            for n in (1, 32, 256, 64, 512, 16, 128):
                model(torch.randn(n, 784)).softmax(-1)

    return run


# ----------------------------------------------------------------------------- varying shapes


@workload(
    "bert_infer_varlen",
    "transformers.BertModel (BERT-base sized), inference, 8 requests of (batch, seq) "
    "(1,37) (8,128) (4,512) (2,77) (16,64) (1,384) (32,32) (4,200), fp32",
)
def bert_infer_varlen():
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(attn_implementation="sdpa")).eval()
    shapes = [(1, 37), (8, 128), (4, 512), (2, 77), (16, 64), (1, 384), (32, 32), (4, 200)]

    def run():
        with torch.no_grad():
            for b, s in shapes:
                ids = torch.randint(0, 30522, (b, s))
                model(input_ids=ids, attention_mask=torch.ones_like(ids))

    return run


@workload(
    "resnet50_infer_varbatch",
    "torchvision.models.resnet50(weights=None), inference, batches 1, 8, 32, 4, 16 at "
    "224x224 then 2 at 320x320, fp32",
)
def resnet50_infer_varbatch():
    import torchvision

    shapes = [(1, 224), (8, 224), (32, 224), (4, 224), (16, 224), (2, 320)]
    return image_inference(torchvision.models.resnet50(weights=None), shapes)


@workload(
    "t5_generate_varlen",
    "transformers.T5ForConditionalGeneration (t5-small sized), greedy generate: "
    "requests of (batch, source len, new tokens) (1,64,32) (4,256,48) (2,128,16) "
    "(8,96,32), fp32",
)
def t5_generate_varlen():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        d_model=512, d_ff=2048, num_layers=6, num_heads=8, decoder_start_token_id=0
    )
    model = T5ForConditionalGeneration(cfg).eval()
    reqs = [(1, 64, 32), (4, 256, 48), (2, 128, 16), (8, 96, 32)]
    inputs = [torch.randint(0, 32128, (b, s)) for b, s, _ in reqs]

    def run():
        for ids, (_, _, n) in zip(inputs, reqs):
            greedy_generate(model, ids, n)

    return run


# ----------------------------------------------------------------------------- training


def lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


@workload(
    "llama_pretrain",
    "transformers.LlamaForCausalLM (768 hidden, 8 layers, 12 heads, 2048 FFN, 32k vocab, "
    "~97M parameters), pre-training: batch 4, seq 256, AdamW, 3 steps, fp32",
)
def llama_pretrain():
    from transformers import LlamaForCausalLM

    cfg = tiny_llama_config(
        hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=12
    )
    model = LlamaForCausalLM(cfg)
    return adamw_train_steps(
        model, lambda i: torch.randint(0, 32000, (4, 256)), 3, lm_loss
    )


@workload(
    "gpt2_pretrain_bf16",
    "transformers.GPT2LMHeadModel (6 layers, 768 hidden), pre-training under "
    "torch.autocast(cpu, bfloat16): batch 4, seq 256, AdamW, 3 steps",
)
def gpt2_pretrain_bf16():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=6))

    def loss(m, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return m(input_ids=ids, labels=ids).loss

    return adamw_train_steps(model, lambda i: torch.randint(0, 50257, (4, 256)), 3, loss)


@workload(
    "mixtral_moe_train",
    "transformers.MixtralForCausalLM (512 hidden, 4 layers, 8 experts top-2, 1024 expert "
    "FFN, 32k vocab), training: batch 4, seq 256, AdamW, 3 steps, fp32",
)
def mixtral_moe_train():
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        attn_implementation="sdpa",
    )
    model = MixtralForCausalLM(cfg)
    return adamw_train_steps(
        model, lambda i: torch.randint(0, 32000, (4, 256)), 3, lm_loss
    )


@workload(
    "llama_lora_finetune",
    "peft LoRA (r=16 on q/k/v/o projections) over transformers.LlamaForCausalLM (1024 "
    "hidden, 8 layers, 2816 FFN, 32k vocab, frozen), fine-tuning: batch 4, seq 256, "
    "AdamW, 3 steps, fp32",
)
def llama_lora_finetune():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    cfg = tiny_llama_config(
        hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=16
    )
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(
        base,
        LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    return adamw_train_steps(
        model, lambda i: torch.randint(0, 32000, (4, 256)), 3, lm_loss
    )


@workload(
    "unet_train",
    "diffusers.UNet2DConditionModel (blocks 128/256/512/512, cross-attention 768, 64x64x4 "
    "latents), noise-prediction training: batch 2, 77 text tokens, AdamW, 3 steps, fp32",
)
def unet_train():
    model = small_unet()

    def batch(i):
        return (
            torch.randn(2, 4, 64, 64),
            torch.randint(0, 1000, (2,)),
            torch.randn(2, 77, 768),
        )

    def loss(m, b):
        x, t, ctx = b
        noise = torch.randn_like(x)
        pred = m(x + noise, t, encoder_hidden_states=ctx).sample
        return torch.nn.functional.mse_loss(pred, noise)

    return adamw_train_steps(model, batch, 3, loss)


@workload(
    "unet_sample",
    "diffusers.UNet2DConditionModel (same as unet_train), sampling: 8 denoising steps with "
    "classifier-free guidance (batch 2 = 1 image x 2), 64x64x4 latents, fp32",
)
def unet_sample():
    model = small_unet().eval()
    ctx = torch.randn(2, 77, 768)

    def run():
        with torch.no_grad():
            x = torch.randn(1, 4, 64, 64)
            for t in range(8):
                eps = model(torch.cat([x, x]), torch.tensor([999 - 120 * t] * 2), ctx).sample
                uncond, cond = eps.chunk(2)
                x = x - 0.1 * (uncond + 7.5 * (cond - uncond))

    return run


@workload(
    "vit_train",
    "torchvision.models.vit_b_16(weights=None), training: batch 8, 224x224, "
    "cross-entropy, AdamW, 3 steps, fp32",
)
def vit_train():
    import torchvision

    model = torchvision.models.vit_b_16(weights=None)

    def loss(m, b):
        x, y = b
        return torch.nn.functional.cross_entropy(m(x), y)

    return adamw_train_steps(
        model,
        lambda i: (torch.randn(8, 3, 224, 224), torch.randint(0, 1000, (8,))),
        3,
        loss,
    )


@workload(
    "mlp_train",
    "pure torch MLP (784-1024-1024-10, ReLU), training: batch 128, SGD with momentum, "
    "20 steps, fp32",
)
def mlp_train():
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    data = [(torch.randn(128, 784), torch.randint(0, 10, (128,))) for _ in range(20)]

    def run():
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    return run


# ----------------------------------------------------------------------------- capture


def allocation_events(prof):
    """The profiler's allocation records, in the order they happened: (ptr, bytes)."""
    out = []

    def walk(nodes):
        for n in nodes:
            ef = n.extra_fields
            if type(ef).__name__ == "_ExtraFields_Allocation":
                out.append((n.start_time_ns, len(out), ef.ptr, ef.alloc_size))
            walk(n.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    out.sort()
    return [(ptr, size) for _, _, ptr, size in out]


def to_trace(events):
    """Turns (ptr, ±bytes) records into trace lines; drops frees of earlier memory."""
    live = {}  # ptr -> (id, bytes)
    lines = []
    next_id = 0
    for ptr, size in events:
        if size > 0:
            if ptr in live:
                raise RuntimeError(f"pointer {ptr:#x} allocated twice without a free")
            live[ptr] = (next_id, size)
            lines.append(f"a {next_id} {size} 0")
            next_id += 1
        elif size < 0:
            if ptr not in live:
                continue  # allocated before the capture
            aid, n = live.pop(ptr)
            if n != -size:
                raise RuntimeError(f"free of {ptr:#x} reports {-size} bytes, allocated {n}")
            lines.append(f"f {aid}")
    return lines


def stats(lines):
    """The figures of the traces/README.md table."""
    sizes, live, cur, peak, total = {}, {}, 0, 0, 0
    for line in lines:
        parts = line.split()
        if parts[0] == "a":
            n = int(parts[2])
            sizes[parts[1]] = n
            live[parts[1]] = n
            cur += n
            total += n
            peak = max(peak, cur)
        else:
            cur -= live.pop(parts[1])
    s = sorted(sizes.values())
    return {
        "events": len(lines),
        "allocations": len(s),
        "unfreed": len(live),
        "peak": peak,
        "total": total,
        "min": s[0],
        "median": int(statistics.median_low(s)),
        "max": s[-1],
        "small": sum(1 for x in s if x < 1 << 20),
    }


def capture(name, out_dir):
    desc, build = WORKLOADS[name]
    seed()
    run = build()
    run_start = time.time()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    seconds = time.time() - run_start
    lines = to_trace(allocation_events(prof))
    path = os.path.join(out_dir, f"{name}.trace")
    with open(path, "w") as f:
        f.write(f"# npualloc-trace v1 source={name} events={len(lines)}\n")
        f.write("\n".join(lines) + "\n")
    s = stats(lines)
    print(
        f"| {name} | {desc} | {s['events']:,} | {s['allocations']:,} | {s['unfreed']:,} | "
        f"{s['peak']:,} | {s['total']:,} | {s['min']:,} / {s['median']:,} / {s['max']:,} | "
        f"{s['small']:,} |",
        flush=True,
    )
    print(f"  ({path}: {os.path.getsize(path):,} bytes, {seconds:.1f} s)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="workloads (default: all)")
    ap.add_argument("--out", default="traces/zoo", help="output folder")
    ap.add_argument("--list", action="store_true", help="list the workloads")
    args = ap.parse_args()
    if args.list:
        for name, (desc, _) in WORKLOADS.items():
            print(f"{name}: {desc}")
        return
    unknown = [n for n in args.names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workload(s): {', '.join(unknown)}; see --list")
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}", file=sys.stderr)
    for name in args.names or WORKLOADS:
        capture(name, args.out)


if __name__ == "__main__":
    main()
