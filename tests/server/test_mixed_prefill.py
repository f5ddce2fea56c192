"""A server with SGLang's --chunked-prefill-size and --enable-mixed-chunk: refills mid-run, same tokens at T=0."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
PROMPTS = ["def f(x):", "import sys\n", "class Point:", "for i in range(10):", "while True:\n    x", "return a + b"]


def test_mixed_chunked_prefill_server_is_lossless(start_server, plain_server, tiny_models):
    server = start_server(
        tiny_models["target"], "--max-running-requests", "2", "--chunked-prefill-size", "3", "--enable-mixed-chunk",
        "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(tiny_models["draft"]),
    )  # fmt: skip
    before = server.get("/server_info").json()["internal_states"][0]  # after the server's own warm-up request
    bodies = [{"text": p, "sampling_params": {**GREEDY, "max_new_tokens": 8 + 4 * (i % 3)}} for i, p in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(bodies)) as pool:  # more requests than slots: later ones refill freed slots
        mixed = list(pool.map(lambda b: server.post("/generate", b).json(), bodies))
    for body, out in zip(bodies, mixed):
        assert out["output_ids"] == plain_server.post("/generate", body).json()["output_ids"]
    info = server.get("/server_info").json()
    assert (info["chunked_prefill_size"], info["enable_mixed_chunk"]) == (3, True)
    stats = info["internal_states"][0]
    prefilled = stats["total_prefill_tokens"] - before["total_prefill_tokens"]
    assert prefilled == sum(out["meta_info"]["prompt_tokens"] for out in mixed)  # each prompt token once, unpadded
    assert stats["total_mixed_forwards"] > before["total_mixed_forwards"]
