"""python -m openai_api --triton-grpc 127.0.0.1:18001 --listen 127.0.0.1:18003 --model minilm

The OpenAI routes under /v1, and text-embeddings-inference's (openai_api.tei) beside them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn

from openai_api.app import create_app
from openai_api.backend import TritonBackend
from openai_api.model_files import ModelRepository
from openai_api.protocol import InputLimits
from python_backend.common.contract import MAX_TEXT_BYTES_PER_TOKEN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the OpenAI-compatible adapter in front of Triton")
    parser.add_argument("--triton-grpc", default="127.0.0.1:18001", help="Triton's gRPC host:port")
    parser.add_argument("--listen", default="127.0.0.1:18003", help="host:port to serve on")
    parser.add_argument(
        "--model", action="append", required=True, help="a served model it answers for (repeatable)"
    )
    parser.add_argument(
        "--default-model",
        help="the model TEI's routes serve (/embed, /rerank, /predict, ..., POST /); "
        "/models/NAME/... reach any (default: the first --model)",
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="longest wait for Triton")
    parser.add_argument(
        "--repository",
        type=Path,
        help="the model repository Triton serves (read-only): /v1/tokenize, /v1/decode and "
        "/v1/info read each model's manifest and tokenizer from it, /v1/classify its class names",
    )
    defaults = InputLimits()
    parser.add_argument(
        "--max-tokens-per-input",
        type=int,
        default=defaults.max_tokens_per_input,
        help="tokens one input may hold (a text input: this many times "
        f"{MAX_TEXT_BYTES_PER_TOKEN} UTF-8 bytes)",
    )
    parser.add_argument(
        "--max-tokens-per-request",
        type=int,
        default=defaults.max_tokens_per_request,
        help="token ids one request may hold, all inputs together",
    )
    args = parser.parse_args(argv)
    if args.default_model is not None and args.default_model not in args.model:
        parser.error(f"--default-model {args.default_model} is not one of the --model names")
    if args.max_tokens_per_input < 1 or args.max_tokens_per_request < 1:
        parser.error("--max-tokens-per-input and --max-tokens-per-request must be >= 1")
    host, _, port = args.listen.rpartition(":")
    limits = InputLimits(args.max_tokens_per_input, args.max_tokens_per_request)
    app = create_app(
        TritonBackend(args.triton_grpc, args.model, args.timeout_s),
        limits,
        ModelRepository(args.repository),
        args.default_model,
    )
    uvicorn.run(
        app,
        host=host or "127.0.0.1",
        port=int(port),
        log_level="warning",
        access_log=False,
        # the front door keeps its upstream connections open; outlive its keepalive
        timeout_keep_alive=75,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
