"""The bench-only emulated engine on the real Triton server: it measures the server's own time per
row for a built model without writing into that model's repository; it tokenizes each row for
real and answers zeros (no model ran)."""

from __future__ import annotations

import math
from pathlib import Path

from tokenizers import Tokenizer

from bench.sim.validation import EMULATED, server_time_per_row
from testkit.triton_clients import client, infer, text_inputs
from tools.triton_server import TritonServer


def snapshot(root: Path) -> dict[str, float]:
    """Every file and link under ``root`` with its modification time; not folders, whose times
    change when an entry comes or goes (the path set shows that), and not the bytecode that a
    server's model stubs compile next to model.py (`make test` runs servers over this repository
    in two processes at once)."""
    return {
        str(p.relative_to(root)): p.lstat().st_mtime
        for p in root.rglob("*")
        if "__pycache__" not in p.parts and (p.is_symlink() or not p.is_dir())
    }


def test_the_servers_own_time_is_measured_beside_the_model_never_inside_its_repository(
    repository, tmp_path
):
    before = snapshot(repository)
    us = server_time_per_row(repository / "minilm" / "1", tmp_path, ms=400, concurrency=4)
    assert snapshot(repository) == before
    # rows/s of a server that computes nothing: more than any forward of MiniLM on this CPU takes
    assert math.isfinite(us) and 0 < us < 50_000

    scratch = tmp_path / "server-time-repository"
    assert (scratch / EMULATED / "1" / "emulated_table.txt").read_text().strip() == "zero"
    server = TritonServer.loading_only(scratch, (EMULATED,), tmp_path / "emulated.log")
    server.start()
    server.wait_ready(180)
    c = client(server, "http")
    try:
        rows = ["one row", "and a longer row of text"]
        embeddings, num_tokens = infer(c, EMULATED, text_inputs("http", rows))
        assert embeddings.shape[0] == 2 and not embeddings.any()  # zeros: no model ran
        tokenizer = Tokenizer.from_file(str(repository / "minilm" / "1" / "tokenizer.json"))
        tokenizer.no_padding()
        # the rows were really tokenized, only the forward is emulated
        assert num_tokens.ravel().tolist() == [len(e.ids) for e in tokenizer.encode_batch(rows)]
    finally:
        c.close()  # an open keep-alive connection holds Triton's shutdown for its exit timeout
        server.stop()
