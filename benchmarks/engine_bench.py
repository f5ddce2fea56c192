"""Speed of the embedded engine, measured side by side in one run.

(a) no-speculation decode tok/s at concurrency 1 against transformers `generate` on the same weights;
(b) STANDALONE steps 1..3 against no speculation, at T=0 with ignore_eos and at T=0.7 with natural EOS,
    at concurrency 1 and 16;
(c) aggregate tok/s at concurrency 1, 4, 16, and the engine's own batching ceiling 16*t(B=1)/t(B=16)
    from single batched forward timings.

The Scheduler is driven in-process (its scheduling thread, sinks recording timestamps). Beside each in-process row of
(a) and of (b) at concurrency 1 and 16 stands a "served" row: the same engine and setting behind the HTTP server,
started as the study starts it (`launcher.command.build_command`, with the study's incremental streaming) and
driven by the study's client (`client.cell.run_cell`) on the same prompts; "served ÷ in-process" is what the
server's two processes and the client cost (docs/embedded_engine_served.md). `--no-served` leaves them out.
Decode tok/s of a request = (output tokens - 1) / (last token time - first token time), for the engine
and for transformers alike (a streamer records transformers' token times). Aggregate tok/s of a cell =
all output tokens / (last finish - first submit); a cell keeps `concurrency` requests in flight and runs
at least 4 requests. Cells of different settings are interleaved within
each repeat, and the median over repeats is reported, so machine noise hits all settings alike.

    python benchmarks/engine_bench.py --target results/default/models/target --draft results/default/models/draft
    python benchmarks/engine_bench.py            # no pair given: random weights of the default preset's shape
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from workflow_scripts.engine.model import DecoderModel  # noqa: E402
from workflow_scripts.engine.closed_loop import Timed, run_cell  # noqa: E402
from workflow_scripts.engine.scheduler import Scheduler  # noqa: E402
from workflow_scripts.engine.types import SamplingParams, SpecConfig  # noqa: E402
from workflow_scripts.io import atomic_write_text  # noqa: E402
from workflow_scripts.launcher.process import ServerProcess  # noqa: E402
from workflow_scripts.profiling.served_overhead import served_cell, start_server  # noqa: E402


MIN_REQUESTS_PER_CELL = 4  # low-concurrency cells run several requests back to back, to average out lengths
TOKENIZER_FILES = 60  # the random pair's tokenizer: the smoke preset's corpus size, trained in about 2 s


def random_pair(out: Path) -> tuple[Path, Path]:
    """Random weights shaped like the default preset (realistic, non-degenerate routing: init std 0.1), with a
    tokenizer of the preset's vocabulary trained on the corpus's first files (the server needs one)."""
    from workflow_scripts.models import corpus, tokenizer
    from workflow_scripts.models.architecture import draft_config, target_config
    from workflow_scripts.models.presets import resolve

    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    settings = resolve("default")
    torch.manual_seed(0)
    for cfg, cls, name in ((target_config(settings), Qwen3MoeForCausalLM, "target"), (draft_config(settings), Qwen3ForCausalLM, "draft")):
        cfg.initializer_range = 0.1
        cls(cfg).save_pretrained(out / name)
    tok = tokenizer.train_tokenizer(corpus.build_corpus(TOKENIZER_FILES).train_docs, settings.vocab_size)
    for name in ("target", "draft"):
        tokenizer.save_tokenizer(tok, out / name)
    return out / "target", out / "draft"


def make_prompts(model_dir: Path, n: int, realistic: bool, vocab: int, length: int = 32) -> list[list[int]]:
    """Heads of held-out definitions (realistic, via the study's own workload code) or random ids."""
    if realistic and (model_dir / "tokenizer.json").is_file():
        from workflow_scripts.client.prompts import definition_head, heldout_documents, load_tokenizer

        tok = load_tokenizer(model_dir)
        docs = heldout_documents(model_dir)
        return [tok.encode(definition_head(docs[i % len(docs)]), add_special_tokens=False).ids[:128] for i in range(n)]
    g = torch.Generator().manual_seed(n)
    return torch.randint(2, vocab, (n, length), generator=g).tolist()  # ids 0/1 are EOS/PAD in the built pair


def aggregate_tok_s(cell: list[Timed]) -> float:
    end = max(r.times[-1] for r in cell if r.times)
    return sum(r.tokens for r in cell) / (end - min(r.submit for r in cell))


def accept_length(cell: list[Timed]) -> float:
    verify = sum(r.final.spec_verify_ct for r in cell)
    return sum(r.tokens for r in cell) / verify if verify else float("nan")


def hf_decode_tok_s(model, prompt: list[int], new_tokens: int) -> float:
    """transformers generate (greedy, fixed length) with a streamer recording each token's time."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self):
            self.times: list[float] = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    clock = Clock()
    with torch.inference_mode():
        model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=clock)
    times = clock.times[1:]  # the first put is the prompt
    return (len(times) - 1) / (times[-1] - times[0])


def forward_ms(model: DecoderModel, batch: int, context: int, reps: int) -> float:
    """Median time of one batched T=1 forward (+ LM head) with `context` cached positions per row."""
    cache = model.new_cache(batch, context + 2)
    model.forward(torch.randint(2, model.cfg.vocab_size, (batch, context)), torch.zeros(batch, dtype=torch.long), cache)
    tok = torch.randint(2, model.cfg.vocab_size, (batch, 1))
    start = torch.full((batch,), context)
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            t = time.perf_counter()
            model.logits(model.forward(tok, start, cache))
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def expert_touch(hf_model, prompt: list[int], new_tokens: int) -> str:
    """Distinct experts per layer that 1 and 3 consecutive tokens route to (the batch-1 verify cost driver)."""
    with torch.inference_mode():
        seq = hf_model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        out = hf_model(seq, output_router_logits=True)
    k = hf_model.config.num_experts_per_tok
    per_layer = []
    for logits in out.router_logits:
        ids = logits.topk(k, dim=-1).indices[len(prompt):]
        per_layer.append(statistics.mean(len(set(ids[i : i + 3].flatten().tolist())) for i in range(len(ids) - 2)))
    return f"top-k {k} of E {hf_model.config.num_experts}: 3 consecutive generated tokens touch {statistics.mean(per_layer):.2f} distinct experts per layer (max {3 * k})"


def md_table(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, help="target model dir (default: random weights of the default preset's shape)")
    ap.add_argument("--draft", type=Path, help="draft model dir (required with --target)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both engines (1 is faster on a shared 2-core box)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights/activations, for both engines")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", default="1,2,3")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--enable-mixed-chunk", action="store_true", help="every engine mixes prefill chunks into decode forwards")
    ap.add_argument("--no-served", action="store_true", help="leave out the served rows (no HTTP servers)")
    ap.add_argument("--out", type=Path, help="also write the markdown report here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)  # shows which MoE config is used
    if (args.target is None) != (args.draft is None):
        ap.error("--target and --draft go together")
    torch.set_num_threads(args.threads)
    tmp = None
    source = "the given pair"
    if args.target is None:
        tmp = tempfile.TemporaryDirectory()
        args.target, args.draft = random_pair(Path(tmp.name))
        source = "RANDOM weights of the default preset's shape (no built pair given): acceptance is meaningless"
    steps = [int(s) for s in args.steps.split(",")]
    concs = [int(c) for c in args.concurrency.split(",")]
    max_c = max(concs + [16, MIN_REQUESTS_PER_CELL])
    N = args.new_tokens
    settings: dict[str, SpecConfig | None] = {"none": None}
    settings.update({f"steps{k}": SpecConfig("STANDALONE", k, 1, k + 1, args.draft) for k in steps})
    engines = {name: Scheduler(args.target, spec, max_c, 0, num_threads=args.threads, dtype=args.dtype,
                            enable_mixed_chunk=args.enable_mixed_chunk)
               for name, spec in settings.items()}
    for e in engines.values():
        e.start()
    vocab = engines["none"].vocab_size
    report = [f"# Engine benchmark\n\nPair: `{args.target}` + `{args.draft}` ({source}). Threads: {args.threads}. dtype: {args.dtype}. "
              f"New tokens: {N}. Repeats: {args.repeats} (median). Mixed prefill: {'on' if args.enable_mixed_chunk else 'off'}. "
              "Engine driven in-process (threads)" + ("." if args.no_served else
              "; each served row is the same setting's server over HTTP, started as the study starts it.")]
    servers: dict[str, ServerProcess] = {}
    log_dir = tempfile.TemporaryDirectory(prefix="engine_bench_servers_")
    try:
        if not args.no_served:
            for name, spec in settings.items():
                extra = ["--dtype", args.dtype] + (["--enable-mixed-chunk"] if args.enable_mixed_chunk else [])
                servers[name] = start_server(args.target, args.draft, spec, max_c, args.threads, Path(log_dir.name),
                                             extra)
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(args.target, dtype=getattr(torch, args.dtype)).eval()
        synth = make_prompts(args.target, max_c, realistic=False, vocab=vocab)
        real = make_prompts(args.target, max_c, realistic=True, vocab=vocab)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=N, ignore_eos=True)
        sampled = SamplingParams(temperature=0.7, max_new_tokens=N)
        modes = {"T=0 ignore_eos": (greedy, synth), "T=0.7 natural EOS": (sampled, real)}

        # (a) engine vs transformers at concurrency 1, interleaved
        run_cell(engines["none"], synth[:1], greedy, 1)  # warm-up
        for name, server in servers.items():
            served_cell(server.base_url, synth[:1], greedy, 1)
        a_engine, a_hf, a_served = [], [], []
        for _ in tqdm(range(args.repeats), desc="(a) vs transformers"):
            for prompt in synth[:2]:
                a_hf.append(hf_decode_tok_s(hf, prompt, N))
                a_engine.append(run_cell(engines["none"], [prompt], greedy, 1)[0].decode_tok_s)
                if servers:
                    a_served.append(served_cell(servers["none"].base_url, [prompt], greedy, 1)[0].decode_tok_s)
        eng, ref = statistics.median(a_engine), statistics.median(a_hf)
        a_rows = [["transformers generate", ref, 1.0, ""], ["embedded engine", eng, eng / ref, ""]]
        if a_served:
            served = statistics.median(a_served)
            a_rows.append(["embedded engine, served", served, served / ref, served / eng])
        report.append("## (a) No-speculation decode, concurrency 1 (goal >= 1.5x; served >= 1.3x)\n\n" + md_table(
            ["engine", "decode tok/s", "ratio", "served ÷ in-process"], a_rows))

        # (b) + (c): every setting x mode x concurrency, interleaved across settings per repeat
        cells: dict[tuple, list[list[Timed]]] = {}
        plan = [(mode, c) for mode in modes for c in sorted(set(concs) | {1, 16})]
        model = engines["none"].target
        ctx = len(synth[0]) + N // 2
        t1s, t16s = [], []
        for _ in tqdm(range(args.repeats), desc="(b)/(c) cells"):
            for mode, c in plan:
                params, prompts = modes[mode]
                for name, engine in engines.items():
                    if name != "none" and c not in (1, 16):
                        continue
                    n = max(c, MIN_REQUESTS_PER_CELL)
                    cells.setdefault((name, mode, c), []).append(run_cell(engine, prompts[:n], params, c))
                    if name in servers and c in (1, 16):
                        cells.setdefault((f"{name} served", mode, c), []).append(
                            served_cell(servers[name].base_url, prompts[:n], params, c))
            # forward timings inside each repeat, so they see the same machine load as the cells
            t1s.append(forward_ms(model, 1, ctx, 20))
            t16s.append(forward_ms(model, 16, ctx, 20))

        def med(name, mode, c, fn):
            return statistics.median(fn(cell) for cell in cells[(name, mode, c)])

        def per_req(cell):
            return statistics.median(r.decode_tok_s for r in cell)

        rows = []
        for mode in modes:
            for c in (1, 16):
                for side in ["", " served"] if servers else [""]:
                    base_agg = med("none" + side, mode, c, aggregate_tok_s)
                    for name in engines:
                        key = name + side
                        agg = med(key, mode, c, aggregate_tok_s)
                        acc = med(key, mode, c, accept_length) if name != "none" else float("nan")
                        mean_tokens = statistics.mean(r.tokens for cell in cells[(key, mode, c)] for r in cell)
                        served_ratio = agg / med(name, mode, c, aggregate_tok_s) if side else ""
                        rows.append([mode, c, key, med(key, mode, c, per_req), agg, agg / base_agg, served_ratio, acc,
                                     f"{mean_tokens:.0f}"])
        report.append("## (b) STANDALONE vs no speculation (goal: steps2 >= 1.3x at T=0, read at concurrency 16; "
                      "served ÷ in-process of none >= 0.85 at concurrency 1, >= 0.9 at 16)\n\n" + md_table(
            ["mode", "concurrency", "setting", "per-request tok/s", "aggregate tok/s", "speedup (aggregate)",
             "served ÷ in-process (aggregate)", "accept length", "mean output tokens"], rows))

        # (c) batching
        mode = "T=0 ignore_eos"
        agg = {c: med("none", mode, c, aggregate_tok_s) for c in sorted(set(concs) | {1, 16})}
        t1, t16 = statistics.median(t1s), statistics.median(t16s)
        ceiling = 16 * t1 / t16
        ratio = agg[16] / agg[1]
        report.append("## (c) Batching, no speculation, T=0 ignore_eos\n\n" + md_table(
            ["concurrency", "aggregate tok/s", "vs concurrency 1"], [[c, v, v / agg[1]] for c, v in agg.items()])
            + f"\n\nForward at {ctx} cached positions: t(B=1) = {t1:.2f} ms, t(B=16) = {t16:.2f} ms, "
            f"so 16*t1/t16 = {ceiling:.2f}x is what batching allows. Measured c16/c1 = {ratio:.2f}x = "
            f"{ratio / ceiling:.2f} of it (goal >= 0.8 of what batching allows).")
        report.append("## Routing\n\n" + expert_touch(hf, synth[0], 32))
    finally:
        for e in engines.values():
            e.stop()
        for server in servers.values():
            server.stop()
        log_dir.cleanup()
        if tmp is not None:
            tmp.cleanup()
    text = "\n\n".join(report) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
