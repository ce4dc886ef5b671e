#!/usr/bin/env python3
"""record-workloads.py - allocation traces of PyTorch workloads beyond the
shared three, recorded through magpool_torch with MAGPOOL_TRACE, to check
that magpool's footprint and speed hold on traces it was not tuned on.

    record-workloads.py OUT_DIR [NAME...]

Each workload runs in its own process (the allocator is chosen before the
first CUDA allocation) and writes OUT_DIR/NAME.trace.gz in the format of
tests/data/traces/README.md; replay them with tools/offline-gpu/replay-run.sh
(TRACE_DIR=OUT_DIR).  Models come from transformers configs (no download);
sizes, steps and lengths come from a fixed seed.

  llama_train_varlen  a Llama-style decoder (8 layers, 1024 wide), AdamW,
                      bf16 autocast, 12 steps of batch 8 at a random length
                      of 128..1024 tokens each
  gpt2_generate       GPT-2 (12 layers) greedy generation with its KV cache:
                      6 requests of batch 1..16, prompts of 16..256 tokens,
                      64..160 new tokens
  bert_varlen_train   BERT-base classification, AdamW, bf16 autocast, 15
                      steps of batch 32 at a random length of 64..512
  gpt2_serve_threads  4 threads, each on its own stream, GPT-2 (6 layers)
                      forward passes of batch 1..32 x 32..512 tokens, no grad
  vit_train_varbatch  ViT (6 layers, 384 wide) image classification, AdamW,
                      bf16 autocast, 16 steps at a random batch of 8..96
  t5_beam_generate    T5 (6 + 6 layers) beam search (4 beams), its KV cache
                      reordered every token: 6 requests of batch 1..8,
                      inputs of 32..256 tokens, 32..96 new tokens
  moe_train_varlen    a Mixtral-style decoder (4 layers, 8 experts, 2 a
                      token), AdamW, bf16 autocast, 12 steps of batch 8 at
                      a random length of 64..1024: the experts' batches
                      change size at every layer of every step
Exit 77 when PyTorch with CUDA or transformers is missing."""
import os
import random
import subprocess
import sys
import time

WORKLOADS = ["llama_train_varlen", "gpt2_generate", "bert_varlen_train", "gpt2_serve_threads",
             "vit_train_varbatch", "t5_beam_generate", "moe_train_varlen"]


def train(torch, dev, model, lr, steps, batch):
    """AdamW steps under bf16 autocast, each on batch()'s inputs."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        inputs = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)


def llama_train_varlen(torch, dev, rng):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=2048)
    def batch():
        ids = torch.randint(0, cfg.vocab_size, (8, 64 * rng.randint(2, 16)), device=dev)
        return {"input_ids": ids, "labels": ids}
    train(torch, dev, LlamaForCausalLM(cfg).to(dev), 1e-4, 12, batch)


def gpt2_generate(torch, dev, rng):
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_positions=1024)).to(dev).eval()
    with torch.no_grad():
        for _ in range(6):
            b, p, n = rng.randint(1, 16), rng.randint(16, 256), rng.randint(64, 160)
            ids = torch.randint(0, 50257, (b, p), device=dev)
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize(dev)


def bert_varlen_train(torch, dev, rng):
    from transformers import BertConfig, BertForSequenceClassification
    def batch():
        ids = torch.randint(0, 30522, (32, rng.randint(64, 512)), device=dev)
        return {"input_ids": ids, "labels": torch.randint(0, 4, (32,), device=dev)}
    train(torch, dev, BertForSequenceClassification(BertConfig(num_labels=4)).to(dev), 2e-5, 15,
          batch)


def gpt2_serve_threads(torch, dev, rng):
    import threading
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).to(dev).eval()
    torch.cuda.synchronize(dev)
    seeds = [rng.randint(0, 1 << 30) for _ in range(4)]

    def serve(seed):
        r = random.Random(seed)
        s = torch.cuda.Stream(dev)
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(25):
                ids = torch.randint(0, 50257, (r.randint(1, 32), r.randint(32, 512)), device=dev)
                logits = model(input_ids=ids).logits
                logits[:, -1].argmax(-1).cpu()  # the reply; the stream passes its frees
                del ids, logits
        s.synchronize()

    threads = [threading.Thread(target=serve, args=(x,)) for x in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def vit_train_varbatch(torch, dev, rng):
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=6,
                    num_attention_heads=6, intermediate_size=1536, num_labels=100)
    def batch():
        b = rng.randint(8, 96)
        return {"pixel_values": torch.randn(b, 3, 224, 224, device=dev),
                "labels": torch.randint(0, 100, (b,), device=dev)}
    train(torch, dev, ViTForImageClassification(cfg).to(dev), 1e-4, 16, batch)


def t5_beam_generate(torch, dev, rng):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                   vocab_size=32128, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg).to(dev).eval()
    with torch.no_grad():
        for _ in range(6):
            b, p, n = rng.randint(1, 8), rng.randint(32, 256), rng.randint(32, 96)
            ids = torch.randint(2, 32128, (b, p), device=dev)
            model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=4,
                           max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize(dev)


def moe_train_varlen(torch, dev, rng):
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=32000, hidden_size=512, intermediate_size=1024,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                        num_local_experts=8, num_experts_per_tok=2,
                        max_position_embeddings=2048)
    def batch():
        ids = torch.randint(0, cfg.vocab_size, (8, 64 * rng.randint(1, 16)), device=dev)
        return {"input_ids": ids, "labels": ids}
    train(torch, dev, MixtralForCausalLM(cfg).to(dev), 1e-4, 12, batch)


def child(name, path):
    os.environ["MAGPOOL_TRACE"] = path
    import torch
    import magpool_torch as mt
    mt.enable()
    dev = torch.device("cuda", 0)
    torch.manual_seed(7)
    t0 = time.perf_counter()
    globals()[name](torch, dev, random.Random(name))
    st = mt.memory_stats(dev)
    print("RECORDED workload=%s seconds=%.1f peak_allocated=%d peak_reserved=%d num_ooms=%d"
          % (name, time.perf_counter() - t0, st["allocated_bytes.all.peak"],
             st["reserved_bytes.all.peak"], st["num_ooms"]), flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    try:
        import torch
        import transformers  # noqa: F401
        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except Exception as e:  # noqa: BLE001
        print("record-workloads: skipped:", e)
        return 77
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rc = 0
    for name in sys.argv[2:] or WORKLOADS:
        path = os.path.join(out, name + ".trace")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, path])
        if r.returncode != 0 or not os.path.exists(path):
            print("record-workloads: %s failed (%d)" % (name, r.returncode), flush=True)
            rc = 1
            continue
        subprocess.run(["gzip", "-f", path])
    return rc


if __name__ == "__main__":
    sys.exit(main())
